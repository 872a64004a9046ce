package bench

import (
	"context"
	"errors"
	"os"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/cluster"
)

// Target says where a client workload runs: an existing cluster (MetadataURI) or an in-process
// standalone cluster started for the run.
type Target struct {
	MetadataURI string
	Standalone  bool
	// Bookies and DataDir configure the standalone cluster (DataDir "" = a temporary dir that
	// is removed afterwards).
	Bookies int
	DataDir string
	// Bookie adjusts each standalone bookie's config.
	Bookie func(i int, cfg *bookie.Config)
	// Client, if set, adjusts each client's config (TLS, for example) before the client is
	// made; an error fails the run.
	Client func(cfg *client.Config) error
}

// connected is a target being used: a client, and the cluster when standalone.
type connected struct {
	client  *client.Client
	cluster *cluster.Cluster
	uri     string
	target  Target
	cleanup func()
}

// moreClients opens n-1 further clients (each with its own connection to every bookie) and
// returns them after the first; they are closed by cleanup.
func (c *connected) moreClients(ctx context.Context, n int) ([]*client.Client, error) {
	out := []*client.Client{c.client}
	for len(out) < n {
		cl, err := c.target.NewClient(ctx, c.uri)
		if err != nil {
			return nil, err
		}
		out = append(out, cl)
		prev := c.cleanup
		c.cleanup = func() { cl.Close(); prev() }
	}
	return out, nil
}

// NewClient makes a client of the cluster at uri with t's adjustments.
func (t Target) NewClient(ctx context.Context, uri string) (*client.Client, error) {
	cfg := client.DefaultConfig(uri)
	cfg.Logger = quietLogger()
	if t.Client != nil {
		if err := t.Client(&cfg); err != nil {
			return nil, err
		}
	}
	return client.New(ctx, cfg)
}

func (t Target) connect(ctx context.Context) (*connected, error) {
	c := &connected{cleanup: func() {}}
	uri := t.MetadataURI
	if t.Standalone {
		sc, err := t.startCluster(ctx)
		if err != nil {
			return nil, err
		}
		c = sc
		uri = sc.cluster.MetadataURI()
	}
	if uri == "" {
		return nil, errors.New("bench: give --metadata URI or --standalone")
	}
	cl, err := t.NewClient(ctx, uri)
	if err != nil {
		c.cleanup()
		return nil, err
	}
	c.client, c.uri, c.target = cl, uri, t
	prev := c.cleanup
	c.cleanup = func() { cl.Close(); prev() }
	return c, nil
}

// startCluster starts the standalone cluster of t, without a client.
func (t Target) startCluster(ctx context.Context) (*connected, error) {
	dir, cleanup := t.DataDir, func() {}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "ringkeeper-bench-standalone-")
		if err != nil {
			return nil, err
		}
		dir, cleanup = tmp, func() { os.RemoveAll(tmp) }
	}
	cl, err := cluster.Start(ctx, cluster.Config{DataDir: dir, Bookies: max(t.Bookies, 1), Bookie: t.Bookie, Logger: quietLogger()})
	if err != nil {
		cleanup()
		return nil, err
	}
	return &connected{cluster: cl, cleanup: func() { cl.Close(context.Background()); cleanup() }}, nil
}
