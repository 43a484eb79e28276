"""The synthetic product catalogue and customer questions shared by the demo, the benchmarks, the
int8 quality guard and the tests: deterministic, so every run measures the same texts."""

from __future__ import annotations

import random
from typing import Any

__all__ = ["SCRIPT", "catalogue", "customer_questions", "prose_paragraphs"]

_TYPES = ["dress", "t-shirt", "jeans", "sweater", "rain jacket", "skirt", "shirt", "hoodie", "coat", "shorts"]
_COLOURS = ["red", "navy", "olive", "black", "white", "mustard", "grey", "teal", "burgundy", "beige"]
_NAMES = ["Aurora", "Breeze", "Cedar", "Dune", "Ember", "Fjord", "Glade", "Harbor", "Iris", "Juniper",
          "Kestrel", "Lumen", "Meadow", "Nova", "Orchid", "Pebble", "Quartz", "Ridge", "Sierra", "Tundra"]
# (material, shrinkage in % after a first wash at 40 C)
_MATERIALS = [("cotton", 3.0), ("linen", 4.0), ("wool", 5.0), ("polyester", 0.5), ("viscose", 3.5),
              ("silk", 1.5), ("elastane", 0.0), ("recycled polyester", 0.5)]
_WASH = [("machine wash at 30 C", 0.5), ("machine wash at 40 C", 1.0), ("hand wash cold", 0.3),
         ("dry clean only", 0.0)]
_SIZES = {"jeans": "sizes 26-36", "shorts": "sizes 26-36"}


def catalogue(n: int = 2000, seed: int = 7) -> list[dict[str, Any]]:
    """A deterministic synthetic product catalogue.

    Returns:
        ``n`` products, each ``{"id", "text", "metadata"}`` where the text states type, colour,
        material mix, washing rule, expected shrinkage, sizes and price.
    """
    products = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        kind = _TYPES[i % len(_TYPES)]
        colour = rng.choice(_COLOURS)
        name = f"{_NAMES[(i // len(_TYPES)) % len(_NAMES)]} {i // (len(_TYPES) * len(_NAMES)) + 1}"
        main, main_shrink = rng.choice(_MATERIALS[:6])
        other, other_shrink = rng.choice([m for m in _MATERIALS if m[0] != main])
        share = rng.choice([100, 95, 90, 80, 70, 60])
        wash, wash_factor = rng.choice(_WASH)
        shrink = round((main_shrink * share + other_shrink * (100 - share)) / 100 * wash_factor, 1)
        price = rng.randrange(15, 260)
        sizes = _SIZES.get(kind, "sizes XS-XL")
        mix = f"{share}% {main}" + (f", {100 - share}% {other}" if share < 100 else "")
        text = (
            f"{name} {kind} (SKU P{i:06d}): {colour}, {mix}. Care: {wash}. Expected shrinkage after the "
            f"first wash: {shrink}%. Available in {sizes}. Price: {price} EUR."
        )
        products.append({
            "id": f"P{i:06d}",
            "text": text,
            "metadata": {"type": kind, "colour": colour, "material": main, "price": price,
                         "shrink_pct": shrink, "wash": wash, "name": name},
        })
    return products


SCRIPT = [
    "Hi! I'm looking for a red dress for a summer wedding.",
    "What is the red dress made of?",
    "My budget is under 100 EUR. Which red dress fits that?",
    "Will it shrink after washing?",
]


def customer_questions(n: int, seed: int = 11) -> list[str]:
    """``n`` deterministic customer questions about the catalogue."""
    rng = random.Random(seed)
    templates = [
        "Do you have a {c} {t} in {m}?",
        "How much does the {c} {t} cost?",
        "Will the {c} {t} shrink if I wash it at 40 degrees?",
        "What sizes does the {c} {t} come in?",
        "Is there a {m} {t} under 80 EUR?",
    ]
    return [rng.choice(templates).format(c=rng.choice(_COLOURS), t=rng.choice(_TYPES), m=rng.choice(_MATERIALS)[0])
            for _ in range(n)]


def prose_paragraphs(min_chars: int = 200) -> list[str]:
    """Paragraphs of real English prose that ship with every Python: the language reference's
    topics (``pydoc_data.topics``), code examples left out. Deterministic (sorted by topic)."""
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        for paragraph in topics[name].split("\n\n"):
            text = " ".join(paragraph.split())
            if len(text) >= min_chars and not paragraph.lstrip().startswith((">>>", "...")) \
                    and not paragraph.startswith("   "):
                out.append(text)
    return out
