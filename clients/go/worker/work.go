package worker

import (
	"context"
	"errors"
	"log"
	"sync"
	"sync/atomic"
	"time"
)

// Answer is a handler's output and, when known, its model call's usage.
type Answer struct {
	Output any
	Usage  *Usage
}

// Handler answers one grant; its context is cancelled once the lease is lost.
type Handler func(ctx context.Context, grant Grant) (Answer, error)

// Options for Work; zero values take the defaults noted.
type Options struct {
	Worker       string
	Schema       string
	LeaseSeconds int           // 300
	Heartbeat    time.Duration // a third of the lease
	Idle         time.Duration // 1 s between empty claims
	UntilIdle    bool          // stop once a claim finds no work
}

// Stats counts what Work did.
type Stats struct {
	Committed, Replays, Stale, Refused, HandlerErrors int
	Extensions                                        int64
}

// Work claims one extraction at a time and answers it with handler, extending the lease in
// the background so a handler may run longer than the lease, until ctx ends (or, with
// UntilIdle, a claim finds no work). A handler error leaves the lease to expire and the work
// to be claimed again.
func Work(ctx context.Context, c *Client, handler Handler, o Options) (Stats, error) {
	if o.LeaseSeconds == 0 {
		o.LeaseSeconds = 300
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Duration(o.LeaseSeconds) * time.Second / 3
	}
	if o.Idle == 0 {
		o.Idle = time.Second
	}
	var stats Stats
	for ctx.Err() == nil {
		grants, err := c.Claim(ctx, o.Worker, 1, o.LeaseSeconds, o.Schema)
		if err != nil {
			return stats, err
		}
		if len(grants) == 0 {
			if o.UntilIdle {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(o.Idle):
			}
			continue
		}
		grant := grants[0]
		answer, err := heartbeating(ctx, c, grant, o, &stats.Extensions, handler)
		if err != nil {
			log.Printf("handler failed on %s; its lease will expire: %v", grant.ExtractionID, err)
			stats.HandlerErrors++
			continue
		}
		reply, err := c.PostResult(ctx, grant.ExtractionID, grant.LeaseToken, answer.Output, answer.Usage)
		var api *APIError
		switch {
		case err == nil && reply.Replay:
			stats.Replays++
		case err == nil:
			stats.Committed++
		case IsStaleLease(err):
			stats.Stale++
		case errors.As(err, &api) && (api.Status == 409 || api.Status == 422):
			// The server already decided what becomes of the work (failed, re-asked).
			log.Printf("result for %s refused: %v", grant.ExtractionID, err)
			stats.Refused++
		default:
			return stats, err
		}
	}
	return stats, nil
}

// heartbeating runs handler while a goroutine extends the lease every o.Heartbeat; a 409
// (another worker has the work, or it ended) cancels the handler's context.
func heartbeating(ctx context.Context, c *Client, g Grant, o Options, extensions *int64, handler Handler) (Answer, error) {
	work, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ticker := time.NewTicker(o.Heartbeat)
		defer ticker.Stop()
		for {
			select {
			case <-done:
				return
			case <-ticker.C:
				_, err := c.ExtendLease(work, g.ExtractionID, g.LeaseToken, o.LeaseSeconds)
				var api *APIError
				switch {
				case err == nil:
					atomic.AddInt64(extensions, 1)
				case errors.As(err, &api) && api.Status == 409:
					log.Printf("lease of %s lost: %v", g.ExtractionID, err)
					cancel()
					return
				default:
					log.Printf("heartbeat for %s failed: %v", g.ExtractionID, err)
				}
			}
		}
	}()
	answer, err := handler(work, g)
	close(done)
	wg.Wait()
	return answer, err
}
