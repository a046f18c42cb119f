"""The tools of the `{{name}}` plugin: a Capstan plugin in Python.

Build: `capstan plugins build` (or ./build.sh; makes {{name}}.wasm). Every module a tool
uses must be imported here, at the top: the build snapshots the interpreter, and a module
first imported during a call is not there. BINDINGS.md shows the host's imports in Python.
"""

from capstan_sdk import Toolbox, ToolError

toolbox = Toolbox()


@toolbox.tool(name="{{tool}}", needs=["fs.read"])
def count_words(path: str, top: int = 5) -> dict:
    """Counts the lines and words of a workspace file and lists its most frequent words.

    Args:
        path: a file, relative to the workspace root
        top: how many of the most frequent words to list
    """
    if top < 0:
        raise ToolError.invalid_args("`top` must be 0 or more")
    with open(path, encoding="utf-8") as file:
        text = file.read()
    counts: dict[str, int] = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    frequent = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]
    return {"lines": len(text.splitlines()), "words": sum(counts.values()), "top": frequent}


Tool = toolbox.export()
