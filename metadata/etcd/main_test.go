package etcd_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

// All tests but the restart test share one embedded server; each uses its
// own root.
func TestMain(m *testing.M) { os.Exit(metadatatest.Main(m)) }

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, uri string, opts ...metadata.Options) metadata.Driver {
	t.Helper()
	return metadatatest.Open(t, uri, opts...)
}
