"""The synthetic product catalogue and customer questions shared by the demo, the benchmarks, the
int8 quality guard and the tests: deterministic, so every run measures the same texts."""

from __future__ import annotations

import random
from typing import Any

__all__ = ["SCRIPT", "catalogue", "customer_questions", "prose_paragraphs", "sku_catalogue", "sku_questions"]

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


_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
_ARTICLE_SIZES = ["XS", "S", "M", "L", "XL"]
_SKU_QUESTIONS = [
    "Is article {code} still in stock?",
    "What is the price of {code}?",
    "Can I return {code}, size {size}, after 30 days?",
    "Does {code} shrink in the wash?",
    "I ordered {code} in size {size}: what is it made of?",
    "When will {code} be delivered?",
]


def sku_catalogue(n: int = 3000, seed: int = 5) -> list[dict[str, Any]]:
    """A catalogue whose products are told apart by article codes (``SKU-48213-QX``): many products
    share type, colour and material, so only the code names one (where dense retrieval fails and
    customer-service questions live). Deterministic; codes unique.

    Returns:
        ``n`` products ``{"id", "text", "metadata", "code", "size"}``; the text reads like
        ``"Cedar 2 dress: red, 90% cotton, 10% linen. Care: ... article SKU-48213-QX, size M. Price: 49 EUR."``.
    """
    rng = random.Random(seed)
    codes: set[str] = set()
    while len(codes) < n:
        codes.add(f"SKU-{rng.randrange(10_000, 100_000)}-{rng.choice(_LETTERS)}{rng.choice(_LETTERS)}")
    ordered = sorted(codes, key=lambda c: random.Random(f"{seed}:{c}").random())
    base = catalogue(max(1, n // 6), seed=seed)  # six articles per product line: the words repeat
    out = []
    for i, code in enumerate(ordered):
        product = base[i % len(base)]
        size = _ARTICLE_SIZES[i % len(_ARTICLE_SIZES)]
        head, _, tail = product["text"].partition(" (SKU ")
        details = tail.partition("): ")[2]
        price_at = details.rfind(" Price: ")
        text = f"{head}: {details[:price_at]} Article {code}, size {size}.{details[price_at:]}"
        out.append({"id": code, "text": text, "metadata": dict(product["metadata"], size=size), "code": code,
                    "size": size})
    return out


def sku_questions(products: list[dict[str, Any]], n: int = 60, seed: int = 9) -> list[tuple[str, str]]:
    """``n`` deterministic questions that each name one product's code, as ``(question, product id)``."""
    rng = random.Random(seed)
    picked = rng.sample(range(len(products)), min(n, len(products)))
    return [(rng.choice(_SKU_QUESTIONS).format(code=products[i]["code"], size=products[i]["size"]), products[i]["id"])
            for i in picked]


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
