// LangChain.js (@langchain/openai, as Flowise and most JavaScript apps call OpenAI-compatible
// servers) against a live `gpuprompt serve`. Usage: node client.mjs <base url> <chat model> <embedding model>
// Prints one JSON object with what each call returned; tests/server/test_js_client.py asserts on it.
import { ChatOpenAI, OpenAIEmbeddings } from "@langchain/openai";
import { HumanMessage, ToolMessage } from "@langchain/core/messages";

const [url, chatModel, embedModel] = process.argv.slice(2);
if (!url || !chatModel || !embedModel) {
  console.error("usage: node client.mjs <base url> <chat model> <embedding model>");
  process.exit(2);
}
const baseURL = `${url}/v1`;
const QUESTION = "What does the red dress cost?";
const TEXTS = ["a red cotton dress", "blue denim jeans, slim fit", "Will it shrink after washing? 🧺"];
// An OpenAI-format tool (what Flowise's nodes bind); an enum keeps the small model's argument short.
const GET_PRICE = {
  type: "function",
  function: {
    name: "get_price",
    description: "Price of a product in EUR.",
    parameters: {
      type: "object",
      properties: { product: { type: "string", enum: ["red dress", "blue jeans"] } },
      required: ["product"],
    },
  },
};

const chat = (maxTokens) =>
  new ChatOpenAI({
    model: chatModel,
    temperature: 0,
    maxTokens,
    maxRetries: 0,
    timeout: 120000,
    apiKey: "unused", // a server without --api-key takes any key; the client needs one
    configuration: { baseURL },
  });

const toolCallsOf = (message) =>
  (message.tool_calls ?? []).map((call) => ({ id: call.id, name: call.name, args: call.args }));

const out = {};

// 1. invoke and stream: plain chat.
const model = chat(24);
const invoked = await model.invoke(QUESTION);
out.invoke = {
  content: invoked.content,
  finish_reason: invoked.response_metadata?.finish_reason ?? null,
  usage: invoked.usage_metadata ?? null,
};
let streamed = "";
let chunks = 0;
for await (const chunk of await model.stream(QUESTION)) {
  streamed += typeof chunk.content === "string" ? chunk.content : "";
  chunks += 1;
}
out.stream = { content: streamed, chunks };

// 2. bindTools with a forced choice (the 135M model calls only when constrained), then the tool's
//    result sent back as a `tool` turn and a final answer.
const toolModel = chat(64);
const forced = toolModel.bindTools([GET_PRICE], { tool_choice: "get_price" });
const messages = [new HumanMessage(QUESTION)];
const call = await forced.invoke(messages);
out.tool_call = {
  content: call.content,
  tool_calls: toolCallsOf(call),
  invalid_tool_calls: call.invalid_tool_calls ?? [],
  finish_reason: call.response_metadata?.finish_reason ?? null,
};
let merged = null;
for await (const chunk of await forced.stream(messages)) {
  merged = merged === null ? chunk : merged.concat(chunk);
}
out.tool_call_stream = { tool_calls: toolCallsOf(merged) };
messages.push(call);
for (const toolCall of call.tool_calls ?? []) {
  messages.push(new ToolMessage({ content: "49 EUR", tool_call_id: toolCall.id }));
}
const final = await chat(24).bindTools([GET_PRICE], { tool_choice: "none" }).invoke(messages);
out.tool_result_turn = {
  content: final.content,
  tool_calls: toolCallsOf(final),
  finish_reason: final.response_metadata?.finish_reason ?? null,
};

// 3. OpenAIEmbeddings as a Flowise user configures it: text input; the openai client asks for base64
//    unless an encoding format is set, and decodes it.
const embeddings = (options) =>
  new OpenAIEmbeddings({ model: embedModel, apiKey: "unused", maxRetries: 0, configuration: { baseURL }, ...options });
out.embeddings = {
  base64: { query: await embeddings({}).embedQuery(TEXTS[0]), documents: await embeddings({}).embedDocuments(TEXTS) },
  float: {
    query: await embeddings({ encodingFormat: "float" }).embedQuery(TEXTS[0]),
    documents: await embeddings({ encodingFormat: "float" }).embedDocuments(TEXTS),
  },
};
// Float32Array (the base64 path) is not a JSON array: make every vector a plain one.
for (const format of Object.values(out.embeddings)) {
  format.query = Array.from(format.query);
  format.documents = format.documents.map((vector) => Array.from(vector));
}

process.stdout.write(JSON.stringify(out));
