// Flowise (or any LangChain.js app) without internet access: serve LangChain.js's tokenizer download
// from the js-tiktoken package that is already installed, instead of letting it stall.
//
// Why: with streaming on (Flowise's default), @langchain/openai estimates token usage after every
// call with tiktoken, whose vocabulary @langchain/core fetches from https://tiktoken.pages.dev. Offline
// that fetch fails, and LangChain retries it 6 times with exponential backoff: each chat call then
// takes one to several minutes longer (measured with Flowise 3.1.4: a 2 s answer took 173 s).
//
// Use: NODE_OPTIONS="--require /path/to/flowise_offline_tiktoken.cjs" npx flowise start
// (in Docker: mount the file and set NODE_OPTIONS in the container's environment).
//
// What it does: wraps the global fetch; a GET of https://tiktoken.pages.dev/js/<encoding>.json is
// answered from js-tiktoken's bundled ranks (resolved from the started program, so Flowise's own
// copy), with the same JSON the site serves; when that copy cannot be found, the fetch fails at once
// with an AbortError, which LangChain does not retry (it then counts tokens approximately). Every
// other request goes to the real fetch unchanged.
"use strict";

const { createRequire } = require("node:module");
const path = require("node:path");

const TOKENIZER_URL = /^https:\/\/tiktoken\.pages\.dev\/js\/([a-z0-9_]+)\.json$/;
const realFetch = globalThis.fetch;

function localRanks(encoding) {
  const bases = [process.argv[1], path.join(process.cwd(), "index.js")].filter(Boolean);
  for (const base of bases) {
    try {
      return createRequire(path.resolve(base))(`js-tiktoken/ranks/${encoding}`);
    } catch {
      // not resolvable from there: try the next base
    }
  }
  return null;
}

if (typeof realFetch === "function") {
  globalThis.fetch = async function fetchWithLocalTokenizers(input, init) {
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input?.url;
    const match = typeof url === "string" ? TOKENIZER_URL.exec(url) : null;
    if (!match) {
      return realFetch(input, init);
    }
    const ranks = localRanks(match[1]);
    if (ranks === null) {
      const error = new Error(`AbortError: no local js-tiktoken ranks for ${match[1]} (offline)`);
      error.name = "AbortError";
      throw error;
    }
    return new Response(JSON.stringify(ranks.default ?? ranks), {
      status: 200,
      headers: { "content-type": "application/json" },
    });
  };
}
