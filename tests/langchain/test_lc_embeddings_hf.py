"""GPUPromptEmbeddings takes HuggingFaceEmbeddings' own arguments: the swap is the import only.

Each test builds the stock ``HuggingFaceEmbeddings`` and ours with the very same keyword arguments
on the bundled all-MiniLM-L6-v2 and compares the vectors they return.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpuprompt.errors import ConfigurationError
from gpuprompt.models import resolve_embedding_model
from langchain_gpuprompt import GPUPromptEmbeddings

TEXTS = ["a red summer dress", "waterproof hiking boots", "how do I return an item?"]


@pytest.fixture(scope="module")
def model_path() -> str:
    return str(resolve_embedding_model(None))


def _stock(**kwargs):
    from langchain_huggingface import HuggingFaceEmbeddings

    return HuggingFaceEmbeddings(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model_kwargs": {"device": "cpu"}, "encode_kwargs": {"normalize_embeddings": True, "batch_size": 16}},
        {"model_kwargs": {"device": "cpu"}, "encode_kwargs": {"normalize_embeddings": False}},
        {   # e5-style prompts: one for documents, another for queries
            "model_kwargs": {"device": "cpu"},
            "encode_kwargs": {"prompt": "passage: "},
            "query_encode_kwargs": {"prompt": "query: "},
        },
        {   # named prompts, with a default
            "model_kwargs": {"device": "cpu", "prompts": {"query": "query: ", "doc": "passage: "},
                             "default_prompt_name": "doc"},
            "query_encode_kwargs": {"prompt_name": "query"},
        },
    ],
    ids=["normalized-batch16", "not-normalized", "prompts", "prompt-names"],
)
def test_same_kwargs_as_huggingface_embeddings_give_equal_vectors(model_path: str, kwargs: dict) -> None:
    stock = _stock(model_name=model_path, **kwargs)
    ours = GPUPromptEmbeddings(model_name=model_path, **kwargs)
    assert ours.model_name == ours.model == model_path
    assert np.allclose(ours.embed_documents(TEXTS), stock.embed_documents(TEXTS), atol=1e-5)
    assert np.allclose(ours.embed_query(TEXTS[2]), stock.embed_query(TEXTS[2]), atol=1e-5)
    # The prefixes change the vectors (so the test above would notice a dropped prompt).
    if "query_encode_kwargs" in kwargs:
        assert not np.allclose(ours.embed_query(TEXTS[2]), ours.embed_documents([TEXTS[2]])[0], atol=1e-3)


def test_hf_arguments_become_the_core_settings(model_path: str) -> None:
    ours = GPUPromptEmbeddings(
        model=model_path, model_kwargs={"device": "cpu"},
        encode_kwargs={"normalize_embeddings": False, "batch_size": 8, "show_progress_bar": False},
    )
    config = ours._config()
    assert (config.device, config.normalize, config.batch_size) == ("cpu", False, 8)
    assert ours._embedder is None  # construction loads nothing


async def test_instructions_as_in_bge_embeddings(lc_embeddings: GPUPromptEmbeddings) -> None:
    """``query_instruction`` / ``embed_instruction`` put their text before each query / document."""
    instructed = GPUPromptEmbeddings(query_instruction="query: ", embed_instruction="passage: ")
    assert np.allclose(instructed.embed_query("wool socks"), lc_embeddings.embed_query("query: wool socks"), atol=1e-6)
    assert np.allclose(await instructed.aembed_documents(["wool socks"]),
                       lc_embeddings.embed_documents(["passage: wool socks"]), atol=1e-6)
    assert np.allclose(await instructed.aembed_query("wool socks"), lc_embeddings.embed_query("query: wool socks"),
                       atol=1e-6)


def test_quantize_reaches_the_core_config() -> None:
    assert GPUPromptEmbeddings(quantize="auto")._config().quantize == "auto"
    assert GPUPromptEmbeddings()._config().quantize is None
    with pytest.raises(ConfigurationError, match="'quantize'"):
        GPUPromptEmbeddings(quantize="int4")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="CPU only"):
        GPUPromptEmbeddings(quantize="int8", device="cuda")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model_kwargs": {"revision": "main"}}, r"model_kwargs key\(s\) \['revision'\]"),
        ({"model_kwargs": {"trust_remote_code": True}}, "trust_remote_code"),
        ({"encode_kwargs": {"output_value": "token_embeddings"}}, r"encode_kwargs key\(s\) \['output_value'\]"),
        ({"encode_kwargs": {"precision": "int8"}}, r"precision"),
        ({"encode_kwargs": {"normalize_embeddings": "yes"}}, r"normalize_embeddings"),
        ({"encode_kwargs": {"batch_size": 0}}, "'batch_size' must be an int >= 1"),
        ({"normalize": True, "encode_kwargs": {"normalize_embeddings": False}}, "disagree"),
        ({"device": "cpu", "model_kwargs": {"device": "cuda"}}, "disagree"),
        ({"query_encode_kwargs": {"normalize_embeddings": False}}, "must equal the documents'"),
        ({"encode_kwargs": {"prompt_name": "query"}}, "does not hold"),
        ({"encode_kwargs": {"prompt": "a", "prompt_name": "b"}}, "both 'prompt' and 'prompt_name'"),
        ({"query_instruction": "q: ", "query_encode_kwargs": {"prompt": "query: "}}, "not both"),
        ({"multi_process": True}, "'multi_process' must be False"),
        ({"cache_folder": "/tmp/models"}, "'cache_folder' must be None"),
    ],
)
def test_hf_arguments_without_a_meaning_here_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        GPUPromptEmbeddings(**kwargs)
