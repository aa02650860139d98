// The official JS SDKs pointed at recovery-gateway, the loopback fault
// provider behind it: openai (Chat and Responses), @anthropic-ai/sdk,
// @google/genai. The same cases as gateway/tests/python/test_sdks.py: a
// clean stream, a reset before the first token (before and after the
// head), an overloaded error before it, a reset after it (the SDK's own API
// error), the overloaded error on every attempt (an HTTP error the SDK
// raises), comment blocks mid-stream, and reconnects with the x-recovery-stream-id
// header (same key only; Last-Event-ID where events carry ids; the SDK
// reading the header and the first events itself).
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

async function firstN(iterable, n) {
  const out = [];
  for await (const item of iterable) {
    out.push(item);
    if (out.length === n) break;
  }
  return out;
}

const splitEvents = (bytes) => bytes.toString("utf8").split("\n\n").filter((e) => e.trim());

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
    headEvents: 1,
    auth: ["authorization", `Bearer ${KEY}`],
    expected() {
      return sseText(fixture(this.fixture), ["choices", 0, "delta", "content"]);
    },
    restText(bytes) {
      return sseText(bytes, ["choices", 0, "delta", "content"]);
    },
    create(prefix) {
      const client = new OpenAI({ baseURL: `${GATEWAY}${prefix}/v1`, apiKey: KEY, maxRetries: 0 });
      return client.chat.completions.create({
        model: "m",
        messages: [{ role: "user", content: "hi" }],
        stream: true,
      });
    },
    text: (chunk) => chunk.choices[0]?.delta?.content ?? "",
    apiError: OpenAI.APIError,
  },
  {
    name: "openai-responses",
    path: "/v1/responses",
    fixture: "openai-responses/happy.sse",
    cutAfter: 4,
    headEvents: 4,
    overloaded: {
      headers: SSE,
      body: [
        'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"resp_9","object":"response","status":"in_progress","output":[]}}\n\n' +
          'event: error\ndata: {"type":"error","sequence_number":1,"code":"server_error","message":"Overloaded","param":null}\n\n',
      ],
    },
    auth: ["authorization", `Bearer ${KEY}`],
    expected() {
      return this.restText(fixture(this.fixture));
    },
    restText(bytes) {
      let out = "";
      for (const line of bytes.toString("utf8").split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const event = JSON.parse(line.slice(6));
        if (event.type === "response.output_text.delta") out += event.delta;
      }
      return out;
    },
    create(prefix) {
      const client = new OpenAI({ baseURL: `${GATEWAY}${prefix}/v1`, apiKey: KEY, maxRetries: 0 });
      return client.responses.create({ model: "m", input: "hi", stream: true });
    },
    text: (e) => (e.type === "response.output_text.delta" ? e.delta : ""),
    apiError: OpenAI.APIError,
  },
  {
    name: "anthropic",
    path: "/v1/messages",
    fixture: "anthropic/happy.sse",
    cutAfter: 3,
    headEvents: 3,
    overloaded: { headers: SSE, body: [{ fixture: "anthropic/error-first.sse" }] },
    // @anthropic-ai/sdk sends its apiKey as `Authorization: Bearer`
    // (client.mjs apiKeyAuth): a reconnect brings the same header.
    auth: ["authorization", `Bearer ${KEY}`],
    expected() {
      return sseText(fixture(this.fixture), ["delta", "text"]);
    },
    restText(bytes) {
      return sseText(bytes, ["delta", "text"]);
    },
    create(prefix) {
      const client = new Anthropic({ baseURL: `${GATEWAY}${prefix}`, apiKey: KEY, maxRetries: 0 });
      return client.messages.create({
        model: "m",
        max_tokens: 16,
        messages: [{ role: "user", content: "hi" }],
        stream: true,
      });
    },
    text: (e) => (e.type === "content_block_delta" && e.delta.type === "text_delta" ? e.delta.text : ""),
    apiError: Anthropic.APIError,
  },
  {
    name: "google-genai",
    path: "/v1beta/models/gemini-x:streamGenerateContent",
    fixture: "gemini/lf-happy.sse",
    cutAfter: 0,
    headEvents: 0,
    overloaded: { headers: SSE, body: [{ fixture: "gemini/error-chunk.sse" }] },
    overloadedMessage: "The model is overloaded",
    auth: ["x-goog-api-key", KEY],
    noIds: true,
    expected() {
      return this.restText(fixture(this.fixture));
    },
    restText(bytes) {
      return sseText(bytes, ["candidates", 0, "content", "parts", 0, "text"]);
    },
    async create(prefix) {
      const client = new GoogleGenAI({
        apiKey: KEY,
        httpOptions: { baseUrl: `${GATEWAY}${prefix}`, apiVersion: "v1beta", retryOptions: { attempts: 1 } },
      });
      return client.models.generateContentStream({ model: "gemini-x", contents: "hi" });
    },
    text: (chunk) => chunk.text ?? "",
    // The head's headers, as @google/genai hands them to the caller.
    streamId: (chunks) => chunks[0]?.sdkHttpResponse?.headers?.["x-recovery-stream-id"],
    apiError: ApiError,
  },
];

for (const sdk of SDKS) {
  sdk.read ??= async function (prefix) {
    let text = "";
    for await (const item of await this.create(prefix)) text += this.text(item);
    return text;
  };
  /** The stream id the SDK got in the head, and the text of the first `n` items it yielded. */
  sdk.readFirst ??= async function (prefix, n) {
    let sid;
    let stream;
    if (this.streamId) {
      stream = await this.create(prefix);
    } else {
      const { data, response } = await this.create(prefix).withResponse();
      sid = response.headers.get("x-recovery-stream-id");
      stream = data;
    }
    const items = await firstN(stream, n);
    sid ??= this.streamId(items);
    return [sid, items.map((i) => this.text(i)).join("")];
  };
}

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

    test("a reset after the head, before the first token, is invisible", async () => {
      const ends = eventEnds(fixture(sdk.fixture));
      const cut = sdk.headEvents ? ends[sdk.headEvents - 1] : 0;
      await load({ [path("reset-head")]: [{ ...happy(), cut_at: cut, ending: "rst" }, happy()] });
      assert.equal(await sdk.read(prefix("reset-head")), sdk.expected());
      assert.equal(await sends(path("reset-head")), 2);
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

    test("a failure on every attempt before output is the provider's own error", async () => {
      await load({ [path("all-overloaded")]: Array(8).fill(sdk.overloaded) });
      await assert.rejects(sdk.read(prefix("all-overloaded")), (e) => {
        assert.ok(e instanceof sdk.apiError, `${e?.constructor?.name}: ${e}`);
        // The last attempt is the answer as the provider streamed it,
        // through its error event: the provider's message, not ours.
        const text = String(e.message) + JSON.stringify(e.error ?? "");
        assert.ok(text.includes(sdk.overloadedMessage ?? "Overloaded"), text);
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
      if (sdk.noIds) return;
      const events = splitEvents(body);
      const ids = events.map((e) => e.split("\n").find((l) => l.startsWith("id: "))?.slice(4));
      assert.deepEqual(ids, events.map((_, i) => `${sid}:${i + 1}`));
      // An SSE client's reconnect: the same request with Last-Event-ID.
      const again = async (headers) => {
        const r = await fetch(`${GATEWAY}${path("reconnect")}`, {
          method: "POST",
          headers: { "content-type": "application/json", "last-event-id": `${sid}:2`, ...headers },
          body: "{}",
        });
        return [r.status, Buffer.from(await r.arrayBuffer())];
      };
      const [status, resumed] = await again({ [name]: value });
      assert.equal(status, 200);
      assert.deepEqual(splitEvents(resumed), events.slice(2));
      for (const headers of [{ [name]: value.replace(KEY, OTHER) }, {}]) {
        assert.equal((await again(headers))[0], 404, "Last-Event-ID with another key");
      }
      assert.equal(await sends(path("reconnect")), 1, "reconnects send nothing upstream");
    });

    test("the SDK reads the stream id and reconnects after what it got", async () => {
      await load({ [path("sdk-reconnect")]: [happy()] });
      const [name, value] = sdk.auth;
      const [sid, text] = await sdk.readFirst(prefix("sdk-reconnect"), 2);
      assert.ok(sid, "x-recovery-stream-id in the head the SDK got");
      const rest = await fetch(`${GATEWAY}/streams/${sid}?after=2`, { headers: { [name]: value } });
      assert.equal(rest.status, 200);
      assert.equal(text + sdk.restText(Buffer.from(await rest.arrayBuffer())), sdk.expected());
      assert.equal(await sends(path("sdk-reconnect")), 1);
      const other = await fetch(`${GATEWAY}/streams/${sid}?after=2`, { headers: { [name]: value.replace(KEY, OTHER) } });
      assert.equal(other.status, 404);
      await other.arrayBuffer();
    });
  });
}
