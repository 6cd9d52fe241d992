// Package worker is a small client for commitpoint's external-worker API (docs/API.md,
// "Worker clients"): claims, lease extensions, results, and a lease-aware Work loop.
//
// Every call is retried with backoff on a connection error, 429 and 5xx, never sooner than
// Retry-After. That is safe for each call: a result posted twice is answered as a replay, an
// extension sets the same expiry again, and a claim whose answer was lost leaves a lease that
// simply expires.
package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Grant is one claimed extraction (ClaimGrant in the OpenAPI document).
type Grant struct {
	ExtractionID    string          `json:"extraction_id"`
	LeaseToken      string          `json:"lease_token"`
	LeaseExpiresAt  string          `json:"lease_expires_at"`
	Tenant          string          `json:"tenant"`
	SourceID        string          `json:"source_id"`
	Schema          string          `json:"schema"`
	Attempt         int             `json:"attempt"`
	Metadata        json.RawMessage `json:"metadata"`
	Content         string          `json:"content"`
	Instructions    string          `json:"instructions"`
	SchemaURL       string          `json:"schema_url"`
	PreviousAttempt *struct {
		Output string `json:"output"`
		Issues []struct {
			Path    string `json:"path"`
			Message string `json:"message"`
		} `json:"issues"`
	} `json:"previous_attempt"`
}

// Usage is what the worker's model call used, for the cost ledger.
type Usage struct {
	Model        string `json:"model"`
	InputTokens  uint64 `json:"input_tokens"`
	OutputTokens uint64 `json:"output_tokens"`
}

// ResultReply answers a posted result; Replay when the extraction was already committed.
type ResultReply struct {
	State    string `json:"state"`
	Findings uint64 `json:"findings"`
	Replay   bool   `json:"replay"`
}

// LeaseReply answers a lease extension.
type LeaseReply struct {
	LeaseToken     string `json:"lease_token"`
	LeaseExpiresAt string `json:"lease_expires_at"`
}

// APIError is an answer of the documented shape {"error": {"code", "message", "details"?}}.
type APIError struct {
	Status  int
	Code    string
	Message string
	Details json.RawMessage
}

func (e *APIError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// IsStaleLease tells whether err is 409 stale_lease: another worker has the work.
func IsStaleLease(err error) bool {
	var api *APIError
	return errors.As(err, &api) && api.Code == "stale_lease"
}

// Client calls one commitpoint server.
type Client struct {
	BaseURL  string
	Token    string
	HTTP     *http.Client
	Attempts int
	BaseWait time.Duration
	MaxWait  time.Duration
}

// New returns a client with a 30 s timeout per call and six attempts.
func New(baseURL, token string) *Client {
	return &Client{
		BaseURL:  strings.TrimRight(baseURL, "/"),
		Token:    token,
		HTTP:     &http.Client{Timeout: 30 * time.Second},
		Attempts: 6,
		BaseWait: 200 * time.Millisecond,
		MaxWait:  10 * time.Second,
	}
}

// Claim asks for up to limit extractions under leases of leaseSeconds.
func (c *Client) Claim(ctx context.Context, worker string, limit, leaseSeconds int, schema string) ([]Grant, error) {
	body := map[string]any{"worker": worker, "limit": limit, "lease_seconds": leaseSeconds}
	if schema != "" {
		body["schema"] = schema
	}
	var page struct {
		Claims []Grant `json:"claims"`
	}
	err := c.Do(ctx, http.MethodPost, "/v1/claims", body, &page)
	return page.Claims, err
}

// ExtendLease gives the current lease leaseSeconds more from now.
func (c *Client) ExtendLease(ctx context.Context, id, token string, leaseSeconds int) (LeaseReply, error) {
	var reply LeaseReply
	body := map[string]any{"lease_token": token, "lease_seconds": leaseSeconds}
	err := c.Do(ctx, http.MethodPost, "/v1/extractions/"+id+"/lease", body, &reply)
	return reply, err
}

// PostResult commits output under the lease token (usage may be nil).
func (c *Client) PostResult(ctx context.Context, id, token string, output any, usage *Usage) (ResultReply, error) {
	body := map[string]any{"lease_token": token, "output": output}
	if usage != nil {
		body["usage"] = usage
	}
	var reply ResultReply
	err := c.Do(ctx, http.MethodPost, "/v1/extractions/"+id+"/result", body, &reply)
	return reply, err
}

// Do makes one call with retries and decodes a 2xx answer into out (when not nil).
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return err
		}
	}
	for attempt := 0; ; attempt++ {
		last := attempt == c.Attempts-1
		status, header, text, err := c.once(ctx, method, path, payload)
		switch {
		case err != nil && !last:
			if err := c.wait(ctx, attempt, 0); err != nil {
				return err
			}
			continue
		case err != nil:
			return err
		case status >= 200 && status < 300:
			if out == nil {
				return nil
			}
			return json.Unmarshal(text, out)
		case (status == 429 || status >= 500) && !last:
			if err := c.wait(ctx, attempt, retryAfter(header.Get("Retry-After"))); err != nil {
				return err
			}
			continue
		default:
			return apiError(status, text)
		}
	}
}

func (c *Client) once(ctx context.Context, method, path string, payload []byte) (int, http.Header, []byte, error) {
	var reader io.Reader
	if payload != nil {
		reader = bytes.NewReader(payload)
	}
	request, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, reader)
	if err != nil {
		return 0, nil, nil, err
	}
	request.Header.Set("Accept", "application/json")
	if payload != nil {
		request.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		request.Header.Set("Authorization", "Bearer "+c.Token)
	}
	response, err := c.HTTP.Do(request)
	if err != nil {
		return 0, nil, nil, err
	}
	defer response.Body.Close()
	text, err := io.ReadAll(response.Body)
	return response.StatusCode, response.Header, text, err
}

// wait sleeps a full-jitter backoff, never shorter than the server's Retry-After.
func (c *Client) wait(ctx context.Context, attempt int, retryAfter time.Duration) error {
	ceiling := c.BaseWait << uint(attempt)
	if ceiling > c.MaxWait || ceiling <= 0 {
		ceiling = c.MaxWait
	}
	delay := time.Duration(rand.Int63n(int64(ceiling) + 1))
	if delay < retryAfter {
		delay = retryAfter
	}
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// retryAfter reads delta-seconds; commitpoint sends no HTTP dates.
func retryAfter(value string) time.Duration {
	seconds, err := strconv.ParseFloat(value, 64)
	if err != nil || seconds < 0 {
		return 0
	}
	return time.Duration(seconds * float64(time.Second))
}

func apiError(status int, text []byte) error {
	var body struct {
		Error struct {
			Code    string          `json:"code"`
			Message string          `json:"message"`
			Details json.RawMessage `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(text, &body) != nil || body.Error.Code == "" {
		cut := text
		if len(cut) > 200 {
			cut = cut[:200]
		}
		return &APIError{Status: status, Code: "unexpected_answer", Message: string(cut)}
	}
	return &APIError{Status: status, Code: body.Error.Code, Message: body.Error.Message, Details: body.Error.Details}
}
