"""``gpuprompt serve`` settings: every flag is also a GPUPROMPT_* variable, flags win, the README
table lists them all, and --embed-quantize reaches the embedder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpuprompt.apps.cli import build_parser
from gpuprompt.errors import ConfigurationError
from gpuprompt.server._settings import ServeSettings, env_name, flag_name, load_settings

README = Path(__file__).resolve().parents[2] / "README.md"


def _serve_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["serve"]


def _given(argv: list[str]) -> dict:
    args = _serve_parser().parse_args(argv)
    return {name: getattr(args, name) for name in ServeSettings.model_fields if hasattr(args, name)}


@pytest.fixture
def clean_env(monkeypatch):
    for name in ServeSettings.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)
    return monkeypatch


def test_every_setting_is_a_flag_and_a_variable() -> None:
    flags = {opt for a in _serve_parser()._actions for opt in a.option_strings if opt.startswith("--")}
    assert flags - {"--help"} == {flag_name(name) for name in ServeSettings.model_fields}
    assert flag_name("max_in_flight") == "--max-in-flight"
    assert env_name("max_in_flight") == "GPUPROMPT_MAX_IN_FLIGHT"


def test_defaults_match_serve_and_the_server_config(clean_env) -> None:
    import inspect

    from gpuprompt.server import serve

    options = load_settings().serve_options()
    parameters = inspect.signature(serve).parameters
    assert set(options) <= set(parameters)
    for name, value in options.items():
        if name not in ("api_key",):
            assert parameters[name].default == value, name


def test_environment_sets_and_flags_win(clean_env) -> None:
    clean_env.setenv("GPUPROMPT_PORT", "9001")
    clean_env.setenv("GPUPROMPT_HOST", "0.0.0.0")
    clean_env.setenv("GPUPROMPT_ANY_MODEL_NAME", "true")
    clean_env.setenv("GPUPROMPT_EMBED_QUANTIZE", "int8")
    clean_env.setenv("GPUPROMPT_MAX_IN_FLIGHT", "12")
    settings = load_settings(**_given([]))
    assert (settings.port, settings.host, settings.any_model_name, settings.embed_quantize) == (9001, "0.0.0.0", True, "int8")
    assert settings.serve_options()["strict_model_names"] is False
    settings = load_settings(**_given(["--port", "9002", "--max-in-flight", "3", "--embed-quantize", "auto"]))
    assert (settings.port, settings.max_in_flight, settings.embed_quantize, settings.host) == (9002, 3, "auto", "0.0.0.0")


def test_empty_variables_count_as_unset(clean_env) -> None:
    clean_env.setenv("GPUPROMPT_API_KEY", "")
    assert load_settings().api_key is None
    clean_env.setenv("GPUPROMPT_API_KEY", "k1")
    assert load_settings().serve_options()["api_key"] == "k1"


def test_bad_values_name_the_flag_and_the_variable(clean_env) -> None:
    clean_env.setenv("GPUPROMPT_PORT", "eighty")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "GPUPROMPT_PORT" in str(info.value) and "--port" in str(info.value)
    with pytest.raises(ConfigurationError, match="--max-in-flight"):
        load_settings(**_given(["--port", "1", "--max-in-flight", "0"]))
    with pytest.raises(SystemExit):
        _serve_parser().parse_args(["--embed-quantize", "int4"])


def test_the_cli_reports_a_bad_variable_and_exits_2(clean_env, capsys) -> None:
    from gpuprompt.apps.cli import _serve

    # _serve, not main(): main() closes the process's shared models on its way out.
    clean_env.setenv("GPUPROMPT_MAX_IN_FLIGHT", "-5")
    assert _serve(build_parser().parse_args(["serve"])) == 2
    assert "GPUPROMPT_MAX_IN_FLIGHT" in capsys.readouterr().err


def test_readme_table_lists_every_flag_with_its_variable_and_default() -> None:
    text = README.read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(--[a-z-]+)[^`]*` \|.*$", text, re.MULTILINE)}
    for name, info in ServeSettings.model_fields.items():
        row = rows.get(flag_name(name))
        assert row is not None, f"README lacks a row for {flag_name(name)}"
        assert f"`{env_name(name)}`" in row, row
        default = info.default
        if default not in (None, False):
            shown = {str(default)} | ({f"{default:,}"} if isinstance(default, int) else set()) | (
                {f"{default:g}"} if isinstance(default, float) else set())
            assert any(f"`{s}`" in row or f"| {s} |" in row for s in shown), (row, default)


def test_embed_quantize_reaches_the_runtime_embedder(server_llm) -> None:
    from gpuprompt.server import create_app

    app = create_app(embed_quantize="auto", llm=server_llm, preload=False)
    assert app.state.gpuprompt.embedder.config.quantize == "auto"
    with pytest.raises(ConfigurationError, match="'embed_quantize'"):
        create_app(embed_quantize="int4", llm=server_llm, preload=False)


def test_dtype_flags_reach_the_embedder_and_the_reranker(server_llm, cross_encoder_path: str) -> None:
    from gpuprompt.server import create_app

    settings = load_settings(**_given(["--embed-dtype", "bfloat16", "--rerank-dtype", "bfloat16",
                                       "--rerank-model", cross_encoder_path]))
    assert (settings.embed_dtype, settings.rerank_dtype) == ("bfloat16", "bfloat16")
    options = settings.serve_options()
    app = create_app(embed_dtype=options["embed_dtype"], rerank_dtype=options["rerank_dtype"],
                     rerank_model=cross_encoder_path, llm=server_llm, preload=False)
    state = app.state.gpuprompt
    assert state.embedder.config.dtype == "bfloat16" and state.reranker.config.dtype == "bfloat16"
    with pytest.raises(SystemExit):
        _serve_parser().parse_args(["--embed-dtype", "int8"])
    with pytest.raises(ConfigurationError, match="'rerank_dtype'"):
        create_app(rerank_dtype="fp8", llm=server_llm, preload=False)
    with pytest.raises(ConfigurationError, match="--embed-quantize, --embed-dtype"):
        create_app(embed_quantize="int8", embed_dtype="bfloat16", llm=server_llm, preload=False)


def test_backend_flags_reach_the_embedder_and_the_reranker(server_llm, cross_encoder_path: str) -> None:
    from gpuprompt.server import create_app

    settings = load_settings(**_given(["--embed-backend", "onnx", "--rerank-backend", "onnx",
                                       "--rerank-model", cross_encoder_path]))
    options = settings.serve_options()
    assert (options["embed_backend"], options["rerank_backend"]) == ("onnx", "onnx")
    app = create_app(embed_backend="onnx", rerank_backend="onnx", rerank_model=cross_encoder_path,
                     llm=server_llm, preload=False)
    state = app.state.gpuprompt
    assert state.embedder.config.backend == "onnx" and state.reranker.config.backend == "onnx"
    assert create_app(llm=server_llm, preload=False).state.gpuprompt.embedder.config.backend == "torch"
    with pytest.raises(SystemExit):
        _serve_parser().parse_args(["--embed-backend", "tensorrt"])
    with pytest.raises(ConfigurationError, match="'rerank_backend' must be 'torch' or 'onnx'"):
        create_app(rerank_backend="openvino", llm=server_llm, preload=False)
    with pytest.raises(ConfigurationError, match="--embed-backend, --embed-dtype"):
        create_app(embed_backend="onnx", embed_dtype="bfloat16", llm=server_llm, preload=False)
    with pytest.raises(ConfigurationError, match=r"runs on the CPU only, and 'device' is 'cuda' \(--rerank-backend, --device\)"):
        create_app(rerank_backend="onnx", device="cuda", llm=server_llm, preload=False)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--data-dir", "{file}"], "'data_dir' must be a folder"),  # refused in the app's startup
        (["--data-dir", "{tmp}/d", "--vector-uri", "{tmp}/m.db"], "must not both be set"),  # by the config
    ],
)
def test_a_refused_start_is_one_line_and_exit_2(tmp_path, argv, said) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "file").write_text("not a folder")
    argv = [a.format(file=tmp_path / "file", tmp=tmp_path) for a in argv]
    code = "import sys; from gpuprompt.apps.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "serve", "--port", "0", "--llm-backend", "transformers", *argv],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "gpuprompt serve: " in done.stderr and said in done.stderr
    assert "Traceback" not in done.stderr


async def test_served_model_names_replace_the_ids_everywhere(embedder, server_llm, reranker) -> None:
    """``--served-model-name`` and its embedding / rerank twins, as vLLM, infinity and TEI have them: the
    names are what /v1/models, /health and every response say, and what a request's ``model`` must be
    (a reranker loaded from a folder is otherwise listed under the folder's path)."""
    from support.asgi import InProcessServer

    from gpuprompt.server import create_app

    settings = load_settings(**_given(["--served-model-name", "smol", "--served-embedding-model-name", "minilm",
                                       "--served-rerank-model-name", "bge-reranker-base"]))
    names = {k: v for k, v in settings.serve_options().items() if k.startswith("served_")}
    assert names == {"served_model_name": "smol", "served_embedding_model_name": "minilm",
                     "served_rerank_model_name": "bge-reranker-base"}
    server = InProcessServer(create_app(embedder=embedder, llm=server_llm, reranker=reranker, **names)).start()
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    try:
        async with server.client() as http:
            assert [card["id"] for card in (await http.get("/v1/models")).json()["data"]] == [
                "smol", "minilm", "bge-reranker-base"]
            assert (await http.get("/v1/models/smol")).status_code == (await http.get("/models/minilm")).status_code == 200
            assert (await http.get(f"/v1/models/{embedder.model_id}")).status_code == 404  # the id is not public
            health = (await http.get("/health")).json()
            assert (health["chat_model"], health["embedding_model"], health["rerank_model"]) == (
                "smol", "minilm", "bge-reranker-base")
            replies = {
                "chat": await http.post("/v1/chat/completions", json={**chat, "model": "smol"}),
                "stream": await http.post("/v1/chat/completions", json={**chat, "model": "smol", "stream": True}),
                "embed": await http.post("/v1/embeddings", json={"input": "x", "model": "minilm"}),
                "rerank": await http.post("/v1/rerank", json={"query": "q", "documents": ["a"],
                                                              "model": "bge-reranker-base"}),
                "score": await http.post("/score", json={"text_1": "q", "text_2": "a", "model": "bge-reranker-base"}),
            }
            for kind, reply in replies.items():
                assert reply.status_code == 200, (kind, reply.text)
            assert replies["chat"].json()["model"] == "smol" and '"model":"smol"' in replies["stream"].text
            assert replies["embed"].json()["model"] == "minilm"
            assert replies["rerank"].json()["model"] == replies["score"].json()["model"] == "bge-reranker-base"
            for path, body in (("/v1/chat/completions", {**chat, "model": server_llm.model_name}),
                               ("/v1/embeddings", {"input": "x", "model": embedder.model_id}),
                               ("/v1/rerank", {"query": "q", "documents": ["a"], "model": reranker.model_id})):
                refused = await http.post(path, json=body)  # the id is no longer the public name
                assert refused.status_code == 404 and refused.json()["error"]["param"] == "model", path
    finally:
        server.stop()
    with pytest.raises(ConfigurationError, match="must differ"):
        create_app(embedder=embedder, llm=server_llm, served_model_name="x", served_embedding_model_name="x",
                   preload=False)
    with pytest.raises(ConfigurationError, match="'served_rerank_model_name'"):
        create_app(embedder=embedder, llm=server_llm, served_rerank_model_name=" padded", preload=False)
