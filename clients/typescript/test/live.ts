// Exercises the client against a running commitpoint (`.ci/clients.sh` starts one):
// claim → post → replay → stale lease → lease extension → the work loop with a heartbeat.
// Environment: COMMITPOINT_URL, COMMITPOINT_TOKEN. Exits non-zero on the first failed check.

import { ApiError, Client, work, type Grant } from "../src/index.js";

const SCHEMA = "code-review@1";
const TENANT = "ts-client";
// A one-file diff: findings on a.rs lines 1-3 are grounded in it.
const SOURCE = "diff --git a/a.rs b/a.rs\nnew file mode 100644\n--- /dev/null\n+++ b/a.rs\n@@ -0,0 +1,3 @@\n+a\n+b\n+c\n";
const OUTPUT = { findings: [{ rule: "R1", severity: "high", file: "a.rs", line: 1, summary: "s" }] };

function check(condition: boolean, what: string): void {
  if (!condition) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function refusedWith(call: Promise<unknown>, code: string): Promise<boolean> {
  try {
    await call;
    return false;
  } catch (e) {
    return e instanceof ApiError && e.status === 409 && e.code === code;
  }
}

async function main(): Promise<void> {
  const url = process.env["COMMITPOINT_URL"];
  const token = process.env["COMMITPOINT_TOKEN"];
  if (!url || !token) throw new Error("COMMITPOINT_URL and COMMITPOINT_TOKEN are required");
  const client = new Client(url, { token });

  const submit = async (sourceId: string): Promise<string> => {
    const reply = await client.submit({ tenant: TENANT, source_id: sourceId, schema: SCHEMA, content: SOURCE });
    check(reply.created, `${sourceId} submitted`);
    return reply.extraction_id;
  };
  const claimOnly = async (worker: string, id: string, leaseSeconds: number): Promise<Grant> => {
    const grants = await client.claim({ worker, limit: 1, lease_seconds: leaseSeconds });
    check(grants.length === 1 && grants[0]?.extraction_id === id, `${worker} claims ${id.slice(0, 12)}`);
    return grants[0] as Grant;
  };

  // claim → post → replay
  const first = await submit("post-and-replay");
  const grant = await claimOnly("ts-a", first, 60);
  check(grant.tenant === TENANT && grant.content === SOURCE && grant.instructions !== "", "the grant carries the work");
  const reply = await client.postResult(first, grant.lease_token, OUTPUT);
  check(reply.replay === false && reply.findings === 1 && reply.state === "committed", `committed: ${JSON.stringify(reply)}`);
  const again = await client.postResult(first, grant.lease_token, OUTPUT);
  check(again.replay === true && again.findings === 1, `the same post again is a replay: ${JSON.stringify(again)}`);

  // stale lease: a one-second lease runs out, another worker takes the work over
  const second = await submit("stale");
  const old = await claimOnly("ts-a", second, 1);
  await sleep(1200);
  const taken = await claimOnly("ts-b", second, 60);
  check(await refusedWith(client.postResult(second, old.lease_token, OUTPUT), "stale_lease"),
    "a superseded token's result is refused (409 stale_lease)");
  check(await refusedWith(client.extendLease(second, old.lease_token, 60), "stale_lease"),
    "a superseded token cannot extend (409 stale_lease)");
  check((await client.postResult(second, taken.lease_token, OUTPUT)).replay === false, "the current holder commits");

  // lease extension: a one-second lease extended keeps the work past its first expiry
  const third = await submit("extend");
  const held = await claimOnly("ts-a", third, 1);
  const extended = await client.extendLease(third, held.lease_token, 60);
  check(extended.lease_token === held.lease_token && extended.lease_expires_at > held.lease_expires_at,
    `the extension answers a later expiry (${extended.lease_expires_at})`);
  await sleep(1200);
  check((await client.claim({ worker: "ts-b", limit: 1, lease_seconds: 60 })).length === 0,
    "the extended lease is not handed out again");
  check((await client.postResult(third, held.lease_token, OUTPUT)).replay === false, "the extended lease commits");
  check(await refusedWith(client.extendLease(third, held.lease_token, 60), "illegal_transition"),
    "no extension after the result (409 illegal_transition)");

  // the work loop: a handler slower than its two-second lease is kept alive by the
  // heartbeat, while a rival worker asking all along gets nothing
  const slow = await submit("loop-slow");
  const seen: string[] = [];
  const handler = async (g: Grant) => {
    seen.push(g.extraction_id);
    if (g.extraction_id === slow) await sleep(3000);
    return { output: OUTPUT, usage: { model: "m", input_tokens: 10, output_tokens: 5 } };
  };
  const rivalClaims: Grant[] = [];
  const rivalStop = new AbortController();
  const rival = (async () => {
    while (!rivalStop.signal.aborted) {
      await sleep(300);
      rivalClaims.push(...(await client.claim({ worker: "ts-rival", limit: 10, lease_seconds: 60 })));
    }
  })();
  const slowStats = await work(client, handler, { worker: "ts-loop", leaseSeconds: 2, heartbeatMs: 500, untilIdle: true });
  rivalStop.abort();
  await rival;
  check(seen.length === 1 && seen[0] === slow && slowStats.committed === 1 && slowStats.stale === 0,
    `the slow one committed once: ${JSON.stringify(slowStats)}`);
  check(slowStats.extensions >= 4, `the heartbeat extended its lease (${slowStats.extensions} times)`);
  check(rivalClaims.length === 0, "no rival claimed work the heartbeat kept");

  // the loop goes on from one extraction to the next and stops when the queue is empty
  const ids = new Set<string>();
  for (let i = 0; i < 3; i++) ids.add(await submit(`loop-${i}`));
  seen.length = 0;
  const stats = await work(client, handler, { worker: "ts-loop", leaseSeconds: 60, untilIdle: true });
  check(seen.length === 3 && seen.every((id) => ids.has(id)) && new Set(seen).size === 3, "the loop answered each extraction once");
  check(stats.committed === 3 && stats.replays === 0, `all three committed: ${JSON.stringify(stats)}`);
  for (const id of [...ids, slow]) {
    check((await client.extraction(id))["state"] === "committed", `${id.slice(0, 12)} is committed`);
  }
  console.log("typescript client: all checks passed");
}

main().catch((e: unknown) => {
  console.error("FAIL:", e);
  process.exit(1);
});
