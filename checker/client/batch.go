package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// batcher coalesces the checks of concurrent callers into CheckRateLimits calls. A check
// that finds no batch in flight leaves at once: waiting would only add latency, since nothing
// else is being sent. Checks that arrive while a batch is in flight wait for it to come back
// (its round trip is the time they would have queued behind it anyway), at most
// Config.BatchWait, and a batch of Config.BatchMax leaves at once.
type batcher struct {
	c        *Client
	mu       sync.Mutex
	pending  []*call
	timer    *time.Timer
	inFlight int // batches sent and not yet answered
}

// call is one check waiting for its batch's answer.
type call struct {
	msg  *quotaflowv1.CheckRateLimitRequest
	done chan struct{}
	resp *quotaflowv1.CheckRateLimitResponse
	err  error
}

// check sends msg with the next batch and waits for its answer or ctx.
func (b *batcher) check(ctx context.Context, msg *quotaflowv1.CheckRateLimitRequest) (*quotaflowv1.CheckRateLimitResponse, error) {
	cl := &call{msg: msg, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, cl)
	var out []*call
	switch {
	case b.inFlight == 0 || len(b.pending) >= b.c.cfg.BatchMax:
		out = b.take()
	case len(b.pending) == 1:
		b.timer = time.AfterFunc(b.c.cfg.BatchWait, b.flushNow)
	}
	b.mu.Unlock()
	if out != nil {
		go b.send(out)
	}
	select {
	case <-cl.done:
		return cl.resp, cl.err
	case <-ctx.Done():
		// The batch still goes out: the check may be charged, as a cancelled CheckRateLimit may.
		return nil, ctx.Err()
	}
}

// take empties the pending batch and counts it in flight; b.mu is held.
func (b *batcher) take() []*call {
	p := b.pending
	b.pending = nil
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if len(p) > 0 {
		b.inFlight++
	}
	return p
}

// flushNow sends the pending batch, if any.
func (b *batcher) flushNow() {
	b.mu.Lock()
	p := b.take()
	b.mu.Unlock()
	if len(p) > 0 {
		b.send(p)
	}
}

// answered counts a batch back, and sends the checks that waited for it.
func (b *batcher) answered() {
	b.mu.Lock()
	b.inFlight--
	p := b.take()
	b.mu.Unlock()
	if len(p) > 0 {
		go b.send(p)
	}
}

// send sends one batch, retried as a whole while it fails transiently (its checks keep their
// idempotency keys, so those the checker decided are replayed), and answers each call. The
// calls' own contexts do not bound it: it serves them all, and each caller stops waiting when
// its context ends.
func (b *batcher) send(calls []*call) {
	ctx := context.Background()
	defer func() {
		for _, cl := range calls {
			close(cl.done)
		}
		b.answered()
	}()
	if len(calls) == 1 {
		calls[0].resp, calls[0].err = b.c.checkOne(ctx, calls[0].msg)
		return
	}
	req := &quotaflowv1.CheckRateLimitsRequest{Checks: make([]*quotaflowv1.CheckRateLimitRequest, len(calls))}
	for i, cl := range calls {
		req.Checks[i] = cl.msg
	}
	var resp *connect.Response[quotaflowv1.CheckRateLimitsResponse]
	err := b.c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = b.c.rpc.CheckRateLimits(ctx, connect.NewRequest(req))
		return err
	})
	if err == nil && len(resp.Msg.Results) != len(calls) {
		err = connect.NewError(connect.CodeInternal, fmt.Errorf("checker answered %d checks of %d", len(resp.Msg.Results), len(calls)))
	}
	for i, cl := range calls {
		if err != nil {
			cl.err = err
			continue
		}
		switch r := resp.Msg.Results[i].Result.(type) {
		case *quotaflowv1.CheckRateLimitsResult_Response:
			cl.resp = r.Response
		case *quotaflowv1.CheckRateLimitsResult_Error:
			cl.err = connect.NewError(connect.Code(r.Error.Code), errors.New(r.Error.Message))
		default:
			cl.err = connect.NewError(connect.CodeInternal, errors.New("checker answered a check with neither a response nor an error"))
		}
	}
}
