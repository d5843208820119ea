"""The benchmarks' table of the critic's health: medians over updates 5 and later, per seed, and none for rows that
never logged it."""

from benchmarks.critic_health_table import health_table, row_health


def _row(seed, pooled, after=0.5):
    curve = [
        {"update": u, "explained_variance": -50.0 if u < 5 else 0.1, "explained_variance_pooled": p}
        | {"first_value_return_corr": 0.2}
        for u, p in enumerate(pooled, start=1)
    ]
    return {"trainer": "ppo", "seed": seed, "after": after, "curve": curve}


def test_health_is_the_median_from_update_five():
    health = row_health(_row(1, [-9.0, -9.0, -9.0, -9.0, 0.1, 0.5, 0.3]))
    assert health == {"explained_variance": 0.1, "explained_variance_pooled": 0.3, "first_value_return_corr": 0.2}


def test_the_table_shows_each_seed_and_the_rows_mean():
    lines = health_table({"rows": [_row(1, [0.0] * 4 + [0.2] * 3, 0.4), _row(2, [0.0] * 4 + [0.6] * 3, 0.8)]})
    assert "| ppo | 1,2 | 0.10 / 0.10 | 0.20 / 0.60 | 0.20 / 0.20 | 0.40 | 0.600 |" in lines


def test_rows_without_the_critics_health_make_no_table():
    old = {"trainer": "ppo", "seed": 0, "after": 0.5, "curve": [{"update": 5, "explained_variance": 0.1}]}
    assert health_table({"rows": [old]}) == []
