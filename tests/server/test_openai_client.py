"""The official ``openai`` client works unchanged against the server: models, embeddings, chat, streaming."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from gpuprompt import GenerationRequest

CHAT = "SmolLM2-135M-Instruct"  # the short name works as well as the hub id
EMBED = "sentence-transformers/all-MiniLM-L6-v2"
QUESTION = [{"role": "user", "content": "Name three colours of summer dresses."}]


def _direct(llm, messages, **options):
    [result] = llm.generate([GenerationRequest(messages=messages, temperature=0.0, **options)])
    return result


def test_models_lists_the_chat_and_embedding_models(openai_client, server_llm, embedder) -> None:
    ids = [model.id for model in openai_client.models.list()]
    assert ids == [server_llm.model_name, embedder.model_id]
    assert openai_client.models.retrieve(embedder.model_id).id == embedder.model_id


def test_embeddings_float_equal_the_core_embedder(openai_client, embedder) -> None:
    texts = ["a red cotton dress", "blue denim jeans", "will it shrink after washing?"]
    response = openai_client.embeddings.create(model=embedder.model_id, input=texts, encoding_format="float")
    got = np.array([item.embedding for item in response.data], dtype=np.float32)
    np.testing.assert_allclose(got, embedder.embed(texts), atol=1e-6)
    assert [item.index for item in response.data] == [0, 1, 2]
    assert response.model == embedder.model_id
    assert response.usage.prompt_tokens == sum(embedder.count_tokens(texts)) > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_a_client_set_up_for_infinity_embeds_without_v1(live, embedder) -> None:
    """infinity serves /embeddings and /models at its root, so its users' base URL has no /v1."""
    with openai.OpenAI(base_url=live.url, api_key="unused", max_retries=0, timeout=120.0) as client:
        assert embedder.model_id in [model.id for model in client.models.list()]
        response = client.embeddings.create(model=embedder.model_id, input=["a red dress"], encoding_format="float")
    np.testing.assert_allclose(np.array([response.data[0].embedding], dtype=np.float32),
                               embedder.embed(["a red dress"]), atol=1e-6)


def test_embeddings_base64_default_and_single_string(openai_client, embedder) -> None:
    # The client asks for base64 when no encoding_format is given and decodes it itself.
    response = openai_client.embeddings.create(model="all-MiniLM-L6-v2", input="a linen shirt")
    assert len(response.data) == 1
    vector = np.array(response.data[0].embedding, dtype=np.float32)
    np.testing.assert_array_equal(vector, embedder.embed(["a linen shirt"])[0])


def test_concurrent_embedding_requests_each_get_their_own_vectors(openai_client, embedder) -> None:
    texts = [f"product number {i} in teal wool" for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda t: openai_client.embeddings.create(model=EMBED, input=[t], encoding_format="float"), texts))
    got = np.array([r.data[0].embedding for r in responses], dtype=np.float32)
    np.testing.assert_allclose(got, embedder.embed(texts), atol=1e-5)


def test_chat_completion_equals_the_engine_output(openai_client, server_llm) -> None:
    direct = _direct(server_llm, QUESTION, max_tokens=12)
    response = openai_client.chat.completions.create(
        model=server_llm.model_name, messages=QUESTION, max_tokens=12, temperature=0
    )
    [choice] = response.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == direct.text
    assert choice.finish_reason == direct.finish_reason
    assert response.usage.prompt_tokens == direct.usage.prompt_tokens
    assert response.usage.completion_tokens == direct.usage.completion_tokens
    assert response.usage.total_tokens == direct.usage.total_tokens
    assert response.id.startswith("chatcmpl-")


def test_streaming_sends_the_same_text_in_pieces_with_usage(openai_client, server_llm) -> None:
    direct = _direct(server_llm, QUESTION, max_tokens=12)
    stream = openai_client.chat.completions.create(
        model=CHAT, messages=QUESTION, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1
    assert "".join(pieces) == direct.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [direct.finish_reason]
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == direct.usage.completion_tokens
    assert last.usage.prompt_tokens == direct.usage.prompt_tokens
    assert len({c.id for c in chunks}) == 1


def test_streaming_without_include_usage_sends_no_usage(openai_client) -> None:
    chunks = list(openai_client.chat.completions.create(model=CHAT, messages=QUESTION, max_tokens=4, temperature=0, stream=True))
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_max_completion_tokens_and_stop_reach_the_engine(openai_client, server_llm) -> None:
    response = openai_client.chat.completions.create(model=CHAT, messages=QUESTION, max_completion_tokens=3, temperature=0)
    assert response.usage.completion_tokens <= 3
    direct = _direct(server_llm, QUESTION, max_tokens=12)
    words = direct.text.split()
    assert len(words) >= 3, direct.text
    stop = " " + words[2]
    response = openai_client.chat.completions.create(model=CHAT, messages=QUESTION, max_tokens=12, temperature=0, stop=[stop])
    assert response.choices[0].message.content == direct.text[: direct.text.index(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_n_choices_and_seeded_sampling(openai_client) -> None:
    response = openai_client.chat.completions.create(model=CHAT, messages=QUESTION, max_tokens=6, temperature=0, n=2)
    assert [c.index for c in response.choices] == [0, 1]
    assert response.choices[0].message.content == response.choices[1].message.content
    first = openai_client.chat.completions.create(model=CHAT, messages=QUESTION, max_tokens=8, temperature=0.9, seed=123)
    again = openai_client.chat.completions.create(model=CHAT, messages=QUESTION, max_tokens=8, temperature=0.9, seed=123)
    assert first.choices[0].message.content == again.choices[0].message.content


def test_developer_role_and_text_parts_map_to_system_and_text(openai_client, server_llm) -> None:
    direct = _direct(
        server_llm, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi there"}],
        max_tokens=8,
    )
    response = openai_client.chat.completions.create(
        model=CHAT, messages=[
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": "Hi there"}]},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert response.choices[0].message.content == direct.text


def test_client_errors_are_typed(openai_client) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        openai_client.chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=2)
    assert "gpt-4o" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": "word " * 5000}], max_tokens=2)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:  # 400, as OpenAI answers (not FastAPI's 422)
        openai_client.chat.completions.create(model=CHAT, messages=QUESTION, max_tokens=2, temperature=5)
    assert "'temperature'" in info.value.message
    assert info.value.param == "temperature"


def test_usage_counts_tokens_as_the_model_reads_them(openai_client, embedder, sentence_transformer) -> None:
    short, long = "a red cotton dress", "word " * 2000
    expected = len(sentence_transformer.tokenizer(short)["input_ids"])
    assert embedder.count_tokens([short, long]) == [expected, embedder.max_length]  # long texts are truncated
    response = openai_client.embeddings.create(model=EMBED, input=[short, long])
    assert response.usage.prompt_tokens == expected + embedder.max_length
