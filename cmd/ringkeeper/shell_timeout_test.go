package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// hangDriver is a metadata service that connects (the bookie registry answers) but whose
// ledger store never answers: each call waits for its context.
type hangDriver struct{ metadata.Driver }

func (d hangDriver) Ledgers() metadata.LedgerStore { return hangLedgers{d.Driver.Ledgers()} }

type hangLedgers struct{ metadata.LedgerStore }

func (hangLedgers) Read(ctx context.Context, _ int64) (*metadata.LedgerMetadata, metadata.Version, error) {
	<-ctx.Done()
	return nil, 0, ctx.Err()
}

func (hangLedgers) Delete(ctx context.Context, _ int64, _ metadata.Version) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangLedgers) List(ctx context.Context, _ int64, _ int) ([]int64, bool, error) {
	<-ctx.Done()
	return nil, false, ctx.Err()
}

func init() {
	// hang+etcd://HOSTS/ROOT: the etcd service there, with a ledger store that hangs.
	metadata.RegisterDriver("hang+etcd", func(ctx context.Context, u metadata.URI, opts metadata.Options) (metadata.Driver, error) {
		u.Scheme = "etcd"
		d, err := metadata.Open(ctx, u.String(), opts)
		if err != nil {
			return nil, err
		}
		return hangDriver{d}, nil
	})
}

// TestShellMetadataCallsTimeOut: a shell command whose metadata service accepts the connection
// and then never answers fails once --timeout has passed, with an error naming it, instead of
// hanging.
func TestShellMetadataCallsTimeOut(t *testing.T) {
	c := clustertest.Start(t, 1)
	uri := "hang+" + c.MetadataURI()
	for _, args := range [][]string{
		{"ledger", "list"},
		{"ledger", "delete", "7"},
		{"ledger", "read", "7"},
		{"ledger", "close", "7"},
		{"ledger", "append", "7", "x"},
	} {
		args = append(args, "--metadata", uri, "--timeout", "300ms")
		done := make(chan error, 1)
		go func() { done <- runShell(context.Background(), strings.NewReader(""), args...) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "within --timeout") {
				t.Errorf("shell %s: %v, want an error saying it got no answer within --timeout", strings.Join(args, " "), err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("shell %s against a metadata service that does not answer: still running after 20s", strings.Join(args, " "))
		}
	}
}
