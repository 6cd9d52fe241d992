package worker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// A stub that answers each request with the next of statuses (the last one repeats).
func stub(t *testing.T, statuses []int, retryAfter string) (*Client, *int64) {
	var calls int64
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := atomic.AddInt64(&calls, 1)
		status := statuses[len(statuses)-1]
		if int(n) <= len(statuses) {
			status = statuses[n-1]
		}
		w.Header().Set("Content-Type", "application/json")
		if status == 429 {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
		switch status {
		case 200:
			_, _ = w.Write([]byte(`{"lease_token":"lt","lease_expires_at":"later"}`))
		case 409:
			_, _ = w.Write([]byte(`{"error":{"code":"stale_lease","message":"taken over"}}`))
		default:
			_, _ = w.Write([]byte(`{"error":{"code":"busy","message":"busy"}}`))
		}
	}))
	t.Cleanup(server.Close)
	c := New(server.URL, "tok")
	c.BaseWait = time.Millisecond
	return c, &calls
}

func TestRetriesHonourRetryAfter(t *testing.T) {
	c, calls := stub(t, []int{429, 503, 200}, "1")
	start := time.Now()
	reply, err := c.ExtendLease(context.Background(), "id", "lt", 60)
	if err != nil || reply.LeaseExpiresAt != "later" {
		t.Fatalf("reply %+v, err %v", reply, err)
	}
	if *calls != 3 {
		t.Fatalf("%d calls, want 3", *calls)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("waited %v, less than Retry-After: 1", waited)
	}
}

func TestARefusalIsNotRetried(t *testing.T) {
	c, calls := stub(t, []int{409}, "")
	_, err := c.PostResult(context.Background(), "id", "lt", map[string]any{}, nil)
	if !IsStaleLease(err) || *calls != 1 {
		t.Fatalf("err %v after %d calls, want one stale_lease", err, *calls)
	}
}

func TestTheLastAttemptReturnsTheServerError(t *testing.T) {
	c, calls := stub(t, []int{502}, "")
	c.Attempts = 3
	_, err := c.Claim(context.Background(), "w", 1, 60, "")
	if api, ok := err.(*APIError); !ok || api.Status != 502 || *calls != 3 {
		t.Fatalf("err %v after %d calls, want 502 after 3", err, *calls)
	}
}
