package ingress_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/valyala/fasthttp"

	"github.com/pepsi-pipeline/pepsi/ingress"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// BenchmarkSingleMessageRequest is pepsi-bench -ingress's single-message
// load in one process: concurrent keep-alive clients (fasthttp's, which
// allocate nothing per request) each posting one JSON message at a time.
// Its allocations per request are the server's, the group commit's and
// pgx's; its time is a wall-clock figure, noise on a shared machine.
func BenchmarkSingleMessageRequest(b *testing.B) {
	db := pgtest.NewMigrated(b)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	srv := ingress.New(ingress.Options{Pool: pool, Stages: []string{"a"}, Limits: limitsTest,
		BatchWait: ingress.BatchWaitDefault, BatchIdle: ingress.BatchIdleDefault})
	defer srv.Close()
	s := serve(b, srv, ingress.TimeoutsDefault, nil)
	defer s.Close()
	client := &fasthttp.HostClient{Addr: s.Listener.Addr().String(), MaxConns: 1024}
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, res := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(res)
		req.SetRequestURI(s.URL + "/v1/messages")
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType(ingress.ContentJSON)
		req.SetBodyString(`{"stage": "a", "payload": "ingest"}`)
		for pb.Next() {
			if err := client.DoTimeout(req, res, 30*time.Second); err != nil || res.StatusCode() != 202 {
				b.Errorf("POST: %v %d %s", err, res.StatusCode(), res.Body())
				return
			}
		}
	})
}
