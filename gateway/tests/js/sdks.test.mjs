// The official JS SDKs pointed at recovery-gateway, the loopback fault
// provider behind it: openai (Chat), @anthropic-ai/sdk, @google/genai.
// The same cases as gateway/tests/python/test_sdks.py: a clean stream, a
// reset before the first token, an overloaded error before it, a reset
// after it (the SDK's own API error), comment blocks mid-stream, and a
// reconnect with the x-recovery-stream-id header (same key only).
// Environment: RECOVERY_GATEWAY_URL, FAULT_PROVIDER_URL
// (scripts/test-gateway-sdks.sh). The SDKs never retry on their own.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import Anthropic from "@anthropic-ai/sdk";
import { ApiError, GoogleGenAI } from "@google/genai";
import OpenAI from "openai";

const GATEWAY = process.env.RECOVERY_GATEWAY_URL.replace(/\/$/, "");
const PROVIDER = process.env.FAULT_PROVIDER_URL.replace(/\/$/, "");
const FIXTURES = new URL("../../../tests/fixtures/", import.meta.url);
const SSE = { "content-type": "text/event-stream" };
const COMMENTS = ": keepalive\n\n: OPENROUTER PROCESSING\n\n";
const KEY = "sk-js-sdk-key-0123";
const OTHER = "sk-js-someone-else";

async function control(method, path, body) {
  const res = await fetch(`${PROVIDER}/__fault/${path}`, {
    method,
    headers: { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

const load = (paths) => control("POST", "script?merge", { paths });
const sends = async (path) => (await control("GET", "count")).paths[path] ?? 0;
const fixture = (name) => readFileSync(new URL(name, FIXTURES));

function eventEnds(bytes) {
  const text = bytes.toString("latin1");
  const ends = [];
  for (let at = text.indexOf("\n\n"); at >= 0; at = text.indexOf("\n\n", at + 2)) {
    ends.push(at + 2);
  }
  return ends;
}

/** The text of an SSE fixture: each event's JSON at `path`. */
function sseText(bytes, path) {
  let out = "";
  for (const line of bytes.toString("utf8").split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    let v = JSON.parse(line.slice(6));
    for (const key of path) {
      if (v == null) break;
      v = Array.isArray(v) ? v[0] : v[key];
    }
    if (typeof v === "string") out += v;
  }
  return out;
}

const SDKS = [
  {
    name: "openai",
    path: "/v1/chat/completions",
    fixture: "openai-chat/happy-usage.sse",
    cutAfter: 1,
    overloaded: {
      headers: SSE,
      body: ['data: {"error":{"message":"Overloaded","type":"overloaded_error","param":null,"code":"overloaded"}}\n\n'],
    },
    auth: ["authorization", `Bearer ${KEY}`],
    expected() {
      return sseText(fixture(this.fixture), ["choices", 0, "delta", "content"]);
    },
    async read(prefix) {
      const client = new OpenAI({ baseURL: `${GATEWAY}${prefix}/v1`, apiKey: KEY, maxRetries: 0 });
      const stream = await client.chat.completions.create({
        model: "m",
        messages: [{ role: "user", content: "hi" }],
        stream: true,
      });
      let text = "";
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
      return text;
    },
    apiError: OpenAI.APIError,
  },
  {
    name: "anthropic",
    path: "/v1/messages",
    fixture: "anthropic/happy.sse",
    cutAfter: 3,
    overloaded: { headers: SSE, body: [{ fixture: "anthropic/error-first.sse" }] },
    auth: ["x-api-key", KEY],
    expected() {
      return sseText(fixture(this.fixture), ["delta", "text"]);
    },
    async read(prefix) {
      const client = new Anthropic({ baseURL: `${GATEWAY}${prefix}`, apiKey: KEY, maxRetries: 0 });
      const stream = await client.messages.create({
        model: "m",
        max_tokens: 16,
        messages: [{ role: "user", content: "hi" }],
        stream: true,
      });
      let text = "";
      for await (const e of stream) {
        if (e.type === "content_block_delta" && e.delta.type === "text_delta") text += e.delta.text;
      }
      return text;
    },
    apiError: Anthropic.APIError,
  },
  {
    name: "google-genai",
    path: "/v1beta/models/gemini-x:streamGenerateContent",
    fixture: "gemini/lf-happy.sse",
    cutAfter: 0,
    overloaded: { headers: SSE, body: [{ fixture: "gemini/error-chunk.sse" }] },
    auth: ["x-goog-api-key", KEY],
    noIds: true,
    expected() {
      return sseText(fixture(this.fixture), ["candidates", 0, "content", "parts", 0, "text"]);
    },
    async read(prefix) {
      const client = new GoogleGenAI({
        apiKey: KEY,
        httpOptions: { baseUrl: `${GATEWAY}${prefix}`, apiVersion: "v1beta", retryOptions: { attempts: 1 } },
      });
      const stream = await client.models.generateContentStream({ model: "gemini-x", contents: "hi" });
      let text = "";
      for await (const chunk of stream) text += chunk.text ?? "";
      return text;
    },
    apiError: ApiError,
  },
];

for (const sdk of SDKS) {
  describe(sdk.name, () => {
    const prefix = (c) => `/js-${sdk.name}-${c}`;
    const path = (c) => `${prefix(c)}${sdk.path}`;
    const happy = () => ({ headers: SSE, body: [{ fixture: sdk.fixture }] });

    test("a clean stream is the whole answer", async () => {
      await load({ [path("clean")]: [happy()] });
      assert.equal(await sdk.read(prefix("clean")), sdk.expected());
    });

    test("a reset before the first token is invisible", async () => {
      await load({ [path("reset-first")]: [{ ending: "reset_before_head" }, happy()] });
      assert.equal(await sdk.read(prefix("reset-first")), sdk.expected());
      assert.equal(await sends(path("reset-first")), 2);
    });

    test("an overloaded error before the first token is invisible", async () => {
      await load({ [path("overloaded")]: [sdk.overloaded, happy()] });
      assert.equal(await sdk.read(prefix("overloaded")), sdk.expected());
      assert.equal(await sends(path("overloaded")), 2);
    });

    test("a reset after the first token is the SDK's API error", async () => {
      const cut = eventEnds(fixture(sdk.fixture))[sdk.cutAfter];
      await load({ [path("reset-after")]: [{ ...happy(), cut_at: cut, ending: "rst" }, happy()] });
      await assert.rejects(sdk.read(prefix("reset-after")), (e) => {
        assert.ok(e instanceof sdk.apiError, `${e?.constructor?.name}: ${e}`);
        assert.match(String(e.message) + JSON.stringify(e.error ?? ""), /recovery failed/);
        return true;
      });
      assert.equal(await sends(path("reset-after")), 1);
    });

    test("a failure on every attempt before output is the SDK's API error", async () => {
      await load({ [path("all-overloaded")]: Array(8).fill(sdk.overloaded) });
      await assert.rejects(sdk.read(prefix("all-overloaded")), (e) => {
        assert.ok(e instanceof sdk.apiError, `${e?.constructor?.name}: ${e}`);
        return true;
      });
      assert.ok((await sends(path("all-overloaded"))) >= 2, "retried before giving up");
    });

    test("comment blocks mid-stream are harmless", async () => {
      const data = fixture(sdk.fixture);
      const at = eventEnds(data)[1];
      const body = [
        { fixture: sdk.fixture, start: 0, end: at },
        COMMENTS,
        { fixture: sdk.fixture, start: at, end: data.length },
      ];
      await load({ [path("comments")]: [{ headers: SSE, body }] });
      assert.equal(await sdk.read(prefix("comments")), sdk.expected());
    });

    test("a reconnect reads the rest with the same key only", async () => {
      await load({ [path("reconnect")]: [happy()] });
      const [name, value] = sdk.auth;
      const res = await fetch(`${GATEWAY}${path("reconnect")}`, {
        method: "POST",
        headers: { "content-type": "application/json", [name]: value },
        body: "{}",
      });
      assert.equal(res.status, 200);
      const body = Buffer.from(await res.arrayBuffer());
      const sid = res.headers.get("x-recovery-stream-id");
      assert.ok(sid);
      if (sdk.noIds) assert.deepEqual(body, fixture(sdk.fixture), "only data lines, as sent");
      const rest = await fetch(`${GATEWAY}/streams/${sid}?after=2`, { headers: { [name]: value } });
      assert.equal(rest.status, 200);
      const later = Buffer.from(await rest.arrayBuffer());
      assert.deepEqual(later, body.subarray(eventEnds(body)[1]), "events 3.., no gap or duplicate");
      for (const headers of [{ [name]: value.replace(KEY, OTHER) }, {}]) {
        const other = await fetch(`${GATEWAY}/streams/${sid}?after=2`, { headers });
        assert.equal(other.status, 404);
        await other.arrayBuffer();
      }
    });
  });
}
