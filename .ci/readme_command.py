"""Print README.md's "install and run the whole test suite" command: .ci/run runs exactly it."""

from pathlib import Path

text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
block = text.split("Install and run the whole test suite:", 1)[1]
print(block.split("```sh\n", 1)[1].split("\n```", 1)[0].strip())
