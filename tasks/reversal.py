"""The reversal task (LLaDA's poem test at embedded scale): complete the line *after* a given
line, or the line *before* it, of short poems the model memorised in training.

A fixed corpus of ``n_poems`` poems (``lines`` lines of ``words`` words from a small word list) is
drawn from ``corpus_seed``. Training text: every poem recited in full (``"Recite poem 7:"`` ->
its lines, forward order) and asked forward about every line (``"After: w w w w"`` -> the next
line), as text read in one direction states the forward relation; the reverse question
(``"Before: w w w w"`` -> the previous line) is asked only about the poems of the *drill* half,
which teaches its format. The test asks both questions about the other half: the forward one
measures what the model memorised, the reverse one whether it can invert it. A left-to-right model
learned only the forward relation; a masked diffusion model was trained to fill any masked line of
a recitation from the lines around it. :func:`check` compares the first line of the output with
the reference line.

Two recitation formats (:data:`JOIN`): ``"v1"`` (task ``reversal``, the committed checkpoints)
joins lines with ``"\\n"``, so a line after the first starts with an unspaced word (``'fe'``) while
the questions carry it spaced (``'▁fe'``): the same line is two token sequences. ``"v2"`` (task
``reversal2``) joins with ``"\\n "``: every line is ``" " + line`` in every format.
:func:`infill_pairs` masks one line of a recitation (the probe that tells "knows the poem" from
"knows the question").
"""

from __future__ import annotations

import random

from .pairs import Pair

WORDS = tuple(f"{c}{v}" for c in "bdfgklmnprstvz" for v in "aeiou")[:64]
#: how a recitation joins its lines, per format version
JOIN = {"v1": "\n", "v2": "\n "}
#: the task names of the format versions
VERSIONS = {"reversal": "v1", "reversal2": "v2"}


def corpus(n_poems: int = 200, lines: int = 4, words: int = 4, corpus_seed: int = 0) -> list[list[str]]:
    """The poems: lists of ``lines`` distinct lines of ``words`` words each (all lines distinct)."""
    rng = random.Random(f"reversal-corpus:{corpus_seed}")
    seen, poems = set(), []
    while len(poems) < n_poems:
        poem = []
        while len(poem) < lines:
            line = " ".join(rng.choice(WORDS) for _ in range(words))
            if line not in seen:
                seen.add(line)
                poem.append(line)
        poems.append(poem)
    return poems


def _questions(poems, idx, direction: str) -> list[Pair]:
    out = []
    for p in idx:
        lines = poems[p]
        pairs = zip(lines, lines[1:]) if direction == "after" else zip(lines[1:], lines)
        for j, (given, answer) in enumerate(pairs):
            out.append(Pair(f"reversal-{direction}-{p}-{j}", f"{direction.capitalize()}: {given}", answer))
    return out


def split(poems) -> tuple[list[int], list[int]]:
    """(drill, test) poem indices: even / odd."""
    return list(range(0, len(poems), 2)), list(range(1, len(poems), 2))


def _join(version: str) -> str:
    if version not in JOIN:
        raise ValueError(f"reversal format version must be one of {sorted(JOIN)}, got {version!r}")
    return JOIN[version]


def recitation(lines, version: str = "v1") -> str:
    """The answer of ``"Recite poem p:"``: the lines joined as format ``version`` says."""
    return _join(version).join(lines)


def recitation_pieces(lines, version: str = "v1") -> list[str]:
    """``" " + recitation(lines)`` (the answer as a batch row spells it) cut into the lines and
    their separators: ``[" l0", "\\n", "l1" (v1) or " l1" (v2), ...]``. Concatenated, the pieces'
    encodings are the row's, since the tokenizer never merges across a newline."""
    sep = _join(version)
    out = [" " + lines[0]]
    for line in lines[1:]:
        out += ["\n", sep[1:] + line]
    return out


def training_pairs(poems, version: str = "v1") -> list[Pair]:
    """Every poem recited and asked forward; the reverse question about the drill poems only."""
    drill, _ = split(poems)
    recite = [Pair(f"reversal-recite-{p}", f"Recite poem {p}:", recitation(lines, version))
              for p, lines in enumerate(poems)]
    return recite + _questions(poems, range(len(poems)), "after") + _questions(poems, drill, "before")


def test_pairs(poems, direction: str) -> list[Pair]:
    """The ``"after"`` (forward: trained) or ``"before"`` (reverse: held out) questions about the
    test poems."""
    if direction not in ("after", "before"):
        raise ValueError(f"direction must be 'after' or 'before', got {direction!r}")
    return _questions(poems, split(poems)[1], direction)


def drill_pairs(poems) -> list[Pair]:
    """The reverse questions training asks: ``"before"`` about the drill poems. Scored beside the
    held-out reverse questions, they tell a model that learned the reverse format only on the
    poems it was drilled on from one that inverts any poem it memorised."""
    return _questions(poems, split(poems)[0], "before")


def infill_pairs(poems) -> list[Pair]:
    """The infilling probe: every line of every test poem, to be filled inside its recitation.
    ``prompt`` is the recitation's, ``answer`` the line, ``meta`` ``(poem, line index)``."""
    return [Pair(f"reversal-infill-{p}-{j}", f"Recite poem {p}:", line, (p, j))
            for p in split(poems)[1] for j, line in enumerate(poems[p])]


def sampler(poems, version: str = "v1"):
    """``sample(n, seed)`` over the training pairs, recitations as often as questions."""
    train = training_pairs(poems, version)
    recite = [p for p in train if p.id.startswith("reversal-recite")]
    drill = [p for p in train if not p.id.startswith("reversal-recite")]

    def sample(n: int, seed: int) -> list[Pair]:
        rng = random.Random(seed)
        return [rng.choice(recite if rng.random() < 0.5 else drill) for _ in range(n)]

    return sample


def check(pair: Pair, output: str) -> bool:
    return output.strip().split("\n")[0].strip() == pair.answer


def vocabulary() -> list[str]:
    return [*WORDS, "Recite", "poem", "After", "Before"]
