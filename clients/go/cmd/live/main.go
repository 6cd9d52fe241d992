// Command live exercises the worker package against a running commitpoint (.ci/clients.sh
// starts one): claim → post → replay → stale lease → lease extension → Work with a
// heartbeat. Environment: COMMITPOINT_URL, COMMITPOINT_TOKEN. Exits 1 on the first failed
// check.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"commitpoint/clients/go/worker"
)

const (
	schema = "code-review@1"
	tenant = "go-client"
	// A one-file diff: findings on a.rs lines 1-3 are grounded in it.
	source = "diff --git a/a.rs b/a.rs\nnew file mode 100644\n--- /dev/null\n+++ b/a.rs\n@@ -0,0 +1,3 @@\n+a\n+b\n+c\n"
)

var output = map[string]any{"findings": []any{map[string]any{
	"rule": "R1", "severity": "high", "file": "a.rs", "line": 1, "summary": "s",
}}}

func check(ok bool, format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	if !ok {
		fmt.Fprintf(os.Stderr, "FAIL: %s\n", what)
		os.Exit(1)
	}
	fmt.Printf("ok: %s\n", what)
}

func must[T any](value T, err error) T {
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(1)
	}
	return value
}

func refused(err error, code string) bool {
	var api *worker.APIError
	return errors.As(err, &api) && api.Status == 409 && api.Code == code
}

func main() {
	ctx := context.Background()
	c := worker.New(os.Getenv("COMMITPOINT_URL"), os.Getenv("COMMITPOINT_TOKEN"))
	submit := func(sourceID string) string {
		var reply struct {
			ExtractionID string `json:"extraction_id"`
			Created      bool   `json:"created"`
		}
		body := map[string]any{"tenant": tenant, "source_id": sourceID, "schema": schema, "content": source}
		must(0, c.Do(ctx, http.MethodPost, "/v1/extractions", body, &reply))
		check(reply.Created, "%s submitted", sourceID)
		return reply.ExtractionID
	}
	claimOnly := func(name, id string, leaseSeconds int) worker.Grant {
		grants := must(c.Claim(ctx, name, 1, leaseSeconds, ""))
		check(len(grants) == 1 && grants[0].ExtractionID == id, "%s claims %s", name, id[:12])
		return grants[0]
	}

	// claim → post → replay
	first := submit("post-and-replay")
	grant := claimOnly("go-a", first, 60)
	check(grant.Tenant == tenant && grant.Content == source && grant.Instructions != "", "the grant carries the work")
	reply := must(c.PostResult(ctx, first, grant.LeaseToken, output, nil))
	check(reply == worker.ResultReply{State: "committed", Findings: 1}, "committed: %+v", reply)
	again := must(c.PostResult(ctx, first, grant.LeaseToken, output, nil))
	check(again == worker.ResultReply{State: "committed", Findings: 1, Replay: true}, "the same post again is a replay: %+v", again)

	// stale lease: a one-second lease runs out, another worker takes the work over
	second := submit("stale")
	old := claimOnly("go-a", second, 1)
	time.Sleep(1200 * time.Millisecond)
	taken := claimOnly("go-b", second, 60)
	_, err := c.PostResult(ctx, second, old.LeaseToken, output, nil)
	check(refused(err, "stale_lease") && worker.IsStaleLease(err), "a superseded token's result is refused (409 stale_lease): %v", err)
	_, err = c.ExtendLease(ctx, second, old.LeaseToken, 60)
	check(refused(err, "stale_lease"), "a superseded token cannot extend (409 stale_lease)")
	check(!must(c.PostResult(ctx, second, taken.LeaseToken, output, nil)).Replay, "the current holder commits")

	// lease extension: a one-second lease extended keeps the work past its first expiry
	third := submit("extend")
	held := claimOnly("go-a", third, 1)
	extended := must(c.ExtendLease(ctx, third, held.LeaseToken, 60))
	check(extended.LeaseToken == held.LeaseToken && extended.LeaseExpiresAt > held.LeaseExpiresAt,
		"the extension answers a later expiry (%s)", extended.LeaseExpiresAt)
	time.Sleep(1200 * time.Millisecond)
	check(len(must(c.Claim(ctx, "go-b", 1, 60, ""))) == 0, "the extended lease is not handed out again")
	check(!must(c.PostResult(ctx, third, held.LeaseToken, output, nil)).Replay, "the extended lease commits")

	// Work: a handler slower than its two-second lease is kept alive by the heartbeat, while
	// a rival worker asking all along gets nothing
	slow := submit("loop-slow")
	var seen []string
	handler := func(ctx context.Context, g worker.Grant) (worker.Answer, error) {
		seen = append(seen, g.ExtractionID)
		if g.ExtractionID == slow {
			time.Sleep(3 * time.Second)
		}
		return worker.Answer{Output: output, Usage: &worker.Usage{Model: "m", InputTokens: 10, OutputTokens: 5}}, nil
	}
	var rivalClaims int
	rivalCtx, stopRival := context.WithCancel(ctx)
	var rival sync.WaitGroup
	rival.Add(1)
	go func() {
		defer rival.Done()
		for rivalCtx.Err() == nil {
			time.Sleep(300 * time.Millisecond)
			if grants, err := c.Claim(ctx, "go-rival", 10, 60, ""); err == nil {
				rivalClaims += len(grants)
			}
		}
	}()
	slowStats := must(worker.Work(ctx, c, handler,
		worker.Options{Worker: "go-loop", LeaseSeconds: 2, Heartbeat: 500 * time.Millisecond, UntilIdle: true}))
	stopRival()
	rival.Wait()
	check(len(seen) == 1 && seen[0] == slow && slowStats.Committed == 1 && slowStats.Stale == 0,
		"the slow one committed once: %+v", slowStats)
	check(slowStats.Extensions >= 4, "the heartbeat extended its lease (%d times)", slowStats.Extensions)
	check(rivalClaims == 0, "no rival claimed work the heartbeat kept")

	// the loop goes on from one extraction to the next and stops when the queue is empty
	ids := map[string]bool{slow: true}
	for i := 0; i < 3; i++ {
		ids[submit(fmt.Sprintf("loop-%d", i))] = true
	}
	seen = nil
	stats := must(worker.Work(ctx, c, handler, worker.Options{Worker: "go-loop", LeaseSeconds: 60, UntilIdle: true}))
	distinct := map[string]bool{}
	for _, id := range seen {
		distinct[id] = ids[id] && id != slow
	}
	check(len(seen) == 3 && len(distinct) == 3 && distinct[seen[0]] && distinct[seen[1]] && distinct[seen[2]],
		"the loop answered each extraction once")
	check(stats.Committed == 3 && stats.Replays == 0, "all three committed: %+v", stats)
	for id := range ids {
		var record struct {
			State string `json:"state"`
		}
		must(0, c.Do(ctx, http.MethodGet, "/v1/extractions/"+id, nil, &record))
		check(record.State == "committed", "%s is committed", id[:12])
	}
	fmt.Println("go client: all checks passed")
}
