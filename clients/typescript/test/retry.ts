// The client's retries against a local stub server (node:http): no commitpoint needed.

import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { strict as assert } from "node:assert";

import { ApiError, Client } from "../src/index.js";

// Answers each request with the next status of the script (the last one repeats).
async function stub(statuses: number[], retryAfter = ""): Promise<{ client: Client; calls: () => number; server: Server }> {
  let calls = 0;
  const server = createServer((request, response) => {
    request.resume();
    const status = statuses[Math.min(calls, statuses.length - 1)] ?? 500;
    calls++;
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (status === 429) headers["retry-after"] = retryAfter;
    response.writeHead(status, headers);
    response.end(
      status === 200
        ? JSON.stringify({ lease_token: "lt", lease_expires_at: "later" })
        : JSON.stringify({ error: { code: status === 409 ? "stale_lease" : "busy", message: "m" } }),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const client = new Client(`http://127.0.0.1:${port}`, { token: "tok", retry: { attempts: 3, baseMs: 1 } });
  return { client, calls: () => calls, server };
}

async function main(): Promise<void> {
  {
    const { client, calls, server } = await stub([429, 503, 200], "1");
    const start = Date.now();
    const reply = await client.extendLease("id", "lt", 60);
    assert.equal(reply.lease_expires_at, "later");
    assert.equal(calls(), 3);
    assert.ok(Date.now() - start >= 1000, "Retry-After is a floor");
    server.close();
  }
  {
    const { client, calls, server } = await stub([409]);
    await assert.rejects(client.postResult("id", "lt", {}), (e: unknown) => e instanceof ApiError && e.staleLease);
    assert.equal(calls(), 1, "a refusal is not retried");
    server.close();
  }
  {
    const { client, calls, server } = await stub([502]);
    await assert.rejects(client.claim({ worker: "w" }), (e: unknown) => e instanceof ApiError && e.status === 502);
    assert.equal(calls(), 3, "the last attempt's error is raised");
    server.close();
  }
  console.log("typescript client: retry tests passed");
}

main().catch((e: unknown) => {
  console.error("FAIL:", e);
  process.exit(1);
});
