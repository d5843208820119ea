"""How an option is declared (``fields``: a dataclass field with its help and choices) and where its value comes
from (``layers``: defaults, the command's, a preset, YAML, flags, resolved in that order)."""
