"""The cut-call case shared by the core and server tool tests: two tools with a free-text string
argument and a question the small model keeps writing into that string, so a small ``max_tokens``
cuts the call inside its arguments."""

from __future__ import annotations

FREE_PRICE = {"type": "function", "function": {"name": "get_price", "description": "Price of a product in EUR.",
              "parameters": {"type": "object", "properties": {"product": {"type": "string"}},
                             "required": ["product"]}}}
FREE_STOCK = {"type": "function", "function": {"name": "get_stock", "description": "Units of a product in stock.",
              "parameters": {"type": "object", "properties": {"product": {"type": "string"}},
                             "required": ["product"]}}}
LONG_ASK = [{"role": "user", "content": "What does the long-sleeved organic cotton midi dress with the ruby red "
                                        "floral print and mother-of-pearl buttons, size 38, cost?"}]
