"""A built-in translation task: English number words to German number words.

The task needs no download, so examples, smoke tests and CI can train a real
sequence-to-sequence model in minutes. It is a genuine translation problem in
miniature: German writes a number as one word and puts the units before the
tens ("twenty one" -> "einundzwanzig"), so the model has to reorder, not just
substitute words.

The splits are a fixed, seeded permutation of `0..99,999`: the same on
every machine and Python version, and disjoint from one another.
"""

import random

BUILTIN_TASK_SEED = 1234
"""Seed of the permutation that draws the splits."""

BUILTIN_TASK_RANGE = 100_000
"""The splits draw from the numbers `0 .. BUILTIN_TASK_RANGE - 1`."""

BUILTIN_TASK_SPLIT_SIZES = {"train": 20_000, "val": 500, "test": 500}
"""Number of pairs in each split."""

_MAX_NUMBER = 999_999

_EN_UNITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_EN_TEENS = (
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
)
_EN_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")

_DE_UNITS = ("null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun")
_DE_TEENS = (
    "zehn",
    "elf",
    "zwölf",
    "dreizehn",
    "vierzehn",
    "fünfzehn",
    "sechzehn",
    "siebzehn",
    "achtzehn",
    "neunzehn",
)
_DE_TENS = (
    "",
    "",
    "zwanzig",
    "dreißig",
    "vierzig",
    "fünfzig",
    "sechzig",
    "siebzig",
    "achtzig",
    "neunzig",
)


def _check_number(n):
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"Expected an int, got {n!r} of type {type(n).__name__}")
    if not 0 <= n <= _MAX_NUMBER:
        raise ValueError(f"Number {n} is out of range; supported: 0 to {_MAX_NUMBER}")


def _english_below_1000(n):
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += [_EN_UNITS[hundreds], "hundred"]
    if rest >= 20:
        words.append(_EN_TENS[rest // 10])
        if rest % 10:
            words.append(_EN_UNITS[rest % 10])
    elif rest >= 10:
        words.append(_EN_TEENS[rest - 10])
    elif rest:
        words.append(_EN_UNITS[rest])
    return words


def english_number(n):
    """Spell a number in English words, space separated, without "and".

    Args:
        n: integer from 0 to 999,999.

    Returns:
        the number in lower-case words.

    Raises:
        ValueError: if `n` is not an int in range.

    Example:
        >>> english_number(1234)
        'one thousand two hundred thirty four'
        >>> english_number(21)
        'twenty one'
    """
    _check_number(n)
    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    words = []
    if thousands:
        words += _english_below_1000(thousands) + ["thousand"]
    words += _english_below_1000(rest)
    return " ".join(words)


def _german_below_100(n):
    if n < 10:
        return _DE_UNITS[n]
    if n < 20:
        return _DE_TEENS[n - 10]
    tens, units = divmod(n, 10)
    if units == 0:
        return _DE_TENS[tens]
    # Before "und", one is "ein": einundzwanzig.
    unit_word = "ein" if units == 1 else _DE_UNITS[units]
    return f"{unit_word}und{_DE_TENS[tens]}"


def _german_below_1000(n):
    hundreds, rest = divmod(n, 100)
    word = ""
    if hundreds:
        # As a multiplier, one is "ein": einhundert.
        word = ("ein" if hundreds == 1 else _DE_UNITS[hundreds]) + "hundert"
    if rest:
        word += _german_below_100(rest)
    return word


def german_number(n):
    """Spell a number as one German word, in standard orthography.

    Units come before tens, joined by "und" ("einundzwanzig"). One is "eins"
    when it ends the number ("einhunderteins") and "ein" before "und",
    "hundert" and "tausend"; hundreds and thousands always carry their
    multiplier ("einhundert", "eintausend", not "hundert", "tausend").

    Args:
        n: integer from 0 to 999,999.

    Returns:
        the number as a single lower-case word.

    Raises:
        ValueError: if `n` is not an int in range.

    Example:
        >>> german_number(1234)
        'eintausendzweihundertvierunddreißig'
        >>> german_number(101)
        'einhunderteins'
    """
    _check_number(n)
    if n == 0:
        return "null"
    thousands, rest = divmod(n, 1000)
    word = ""
    if thousands:
        multiplier = _german_below_1000(thousands)
        if multiplier.endswith("eins"):
            multiplier = multiplier[:-1]
        word = multiplier + "tausend"
    if rest:
        word += _german_below_1000(rest)
    return word


def _permutation(size, seed):
    """A Fisher-Yates shuffle of `range(size)` driven only by `Random.random()`.

    `random.Random.random()` is the one part of the `random` module whose
    output Python guarantees to keep across versions for an int seed;
    `shuffle` and `sample` carry no such promise.
    """
    rng = random.Random(seed)
    values = list(range(size))
    for i in range(size - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        values[i], values[j] = values[j], values[i]
    return values


def builtin_task(split):
    """One split of the English -> German number-words task.

    Args:
        split: `train` (20,000 pairs), `val` (500) or `test` (500);
            `validation` and `valid` mean `val`.

    Returns:
        `(english, german)` pairs, e.g. `("twenty one", "einundzwanzig")`,
        in a fixed pseudo-random order. The three splits share no number.

    Raises:
        ValueError: if `split` is not one of the above.

    Example:
        >>> pairs = builtin_task("val")
        >>> len(pairs)
        500
        >>> pairs[2]
        ('eight thousand two hundred eighty three', 'achttausendzweihundertdreiundachtzig')
    """
    split = {"validation": "val", "valid": "val"}.get(split, split)
    if split not in BUILTIN_TASK_SPLIT_SIZES:
        raise ValueError(
            f"Unknown split {split!r}; valid splits: {', '.join(BUILTIN_TASK_SPLIT_SIZES)}"
        )
    start = 0
    for name, size in BUILTIN_TASK_SPLIT_SIZES.items():
        if name == split:
            break
        start += size
    size = BUILTIN_TASK_SPLIT_SIZES[split]
    numbers = _permutation(BUILTIN_TASK_RANGE, BUILTIN_TASK_SEED)[start : start + size]
    return [(english_number(n), german_number(n)) for n in numbers]
