package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/cluster"
)

func standaloneCommand() *cobra.Command {
	var (
		bookies      int
		dataDir      string
		basePort     int
		metadataPort int
		httpPort     int
		writeCacheMB int64
		logLevel     string
	)
	cmd := &cobra.Command{
		Use:   "standalone",
		Short: "Run a whole cluster in one process: embedded etcd and local bookies",
		Long: `Starts an embedded etcd (the metadata store) and --bookies bookies on consecutive ports from
--port, with all data under --data-dir. It prints one line when ready, with the metadata URI and the
bookie addresses, and serves until Ctrl-C. Restarting it on the same data dir keeps every ledger.`,
		// Flags only: a word such as "standalone mydata" (for --data-dir) must not start a
		// cluster on ./data.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger("text", logLevel)
			if err != nil {
				return err
			}
			if bookies < 1 {
				return fmt.Errorf("--bookies %d: a cluster needs at least one bookie", bookies)
			}
			// The key's own conversion: a size whose bytes overflow is refused, not wrapped.
			var parsed bookie.Config
			if _, err := parsed.Apply(map[string]string{"dbStorage_writeCacheMaxSizeMb": strconv.FormatInt(writeCacheMB, 10)}); err != nil {
				return fmt.Errorf("--write-cache-mb: %w", err)
			}
			if writeCacheMB < 1 {
				return fmt.Errorf("--write-cache-mb %d: want at least 1", writeCacheMB)
			}
			// The bookies' cookies record their directories: the same data dir must read the
			// same from any working directory.
			dataDir, err = filepath.Abs(dataDir)
			if err != nil {
				return fmt.Errorf("--data-dir: %w", err)
			}
			if err := checkBookieDirs(dataDir, bookies); err != nil {
				return err
			}
			// Never 0 (a random port): the bookie id names the port, so bookies on other ports
			// next time would not match their own directories' cookies.
			if basePort < 1 || basePort > 65535-(bookies-1) {
				return fmt.Errorf("--port %d: the %d bookies need ports in [1, 65535] from it", basePort, bookies)
			}
			// Not negative either: the cluster then picks random ports (for tests), which
			// nothing prints.
			if httpPort != 0 && (httpPort < 1 || httpPort > 65535-(bookies-1)) {
				return fmt.Errorf("--http-port %d: the %d bookies need ports in [1, 65535] from it (0: no HTTP server)", httpPort, bookies)
			}
			if metadataPort < 0 || metadataPort > 65535 {
				return fmt.Errorf("--metadata-port %d: not a port (0: any free one)", metadataPort)
			}
			// The ports must all differ: each is checked free on its own below, and the start
			// would fail on one that the cluster had taken itself.
			owner := map[int]string{}
			for _, r := range []struct {
				flag     string
				first, n int
			}{{"--port", basePort, bookies}, {"--http-port", httpPort, bookies}, {"--metadata-port", metadataPort, 1}} {
				for p := r.first; p < r.first+r.n && r.first != 0; p++ {
					if other, ok := owner[p]; ok {
						return fmt.Errorf("%s and %s both give port %d: the bookies' ports, their HTTP ports and etcd's must all differ",
							other, r.flag, p)
					}
					owner[p] = r.flag
				}
			}
			for i := range bookies {
				if err := portFree(basePort + i); err != nil {
					return fmt.Errorf("bookie port %d is in use (another standalone or bookie running?); "+
						"stop it or choose another --port: %w", basePort+i, err)
				}
			}
			for i := range bookies {
				if httpPort == 0 {
					break // no HTTP server
				}
				if err := portFree(httpPort + i); err != nil {
					return fmt.Errorf("bookie HTTP port %d is in use (another standalone or bookie running?); "+
						"stop it or choose another --http-port (0: no HTTP server): %w", httpPort+i, err)
				}
			}
			if err := portFree(metadataPort); err != nil {
				return fmt.Errorf("metadata port %d is in use (another etcd or standalone running?); "+
					"stop it or choose another --metadata-port: %w", metadataPort, err)
			}
			if err := os.MkdirAll(dataDir, 0o755); err != nil {
				return err
			}
			var budget int64
			c, err := cluster.Start(cmd.Context(), cluster.Config{
				DataDir: dataDir, Bookies: bookies, BasePort: basePort, MetadataPort: metadataPort,
				HTTPBasePort: httpPort, Logger: log,
				Bookie: func(_ int, cfg *bookie.Config) {
					cfg.Engine.WriteCacheMaxSize = parsed.Engine.WriteCacheMaxSize
					budget += cfg.MemoryBudget()
				},
			})
			if err != nil {
				return err
			}
			setMemoryLimit(budget, log)
			fmt.Fprintf(cmd.OutOrStdout(), "ringkeeper standalone ready: metadata %s bookies %s (data in %s; Ctrl-C to stop)\n",
				c.MetadataURI(), strings.Join(c.BookieAddrs(), ","), dataDir)
			<-cmd.Context().Done()
			fmt.Fprintln(os.Stderr, "stopping")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return c.Close(ctx)
		},
	}
	f := cmd.Flags()
	f.IntVar(&bookies, "bookies", 3, "number of bookies")
	f.StringVar(&dataDir, "data-dir", "./data", "directory for all data (metadata and bookies)")
	f.IntVar(&basePort, "port", 3181, "port of the first bookie; bookie i listens on port+i")
	f.IntVar(&metadataPort, "metadata-port", 2379, "embedded etcd client port")
	f.IntVar(&httpPort, "http-port", 8000, "metrics/admin HTTP port of the first bookie; bookie i uses http-port+i (0 = off)")
	f.Int64Var(&writeCacheMB, "write-cache-mb", 256, "dbStorage_writeCacheMaxSizeMb per bookie")
	f.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn or error")
	return cmd
}

// checkBookieDirs refuses a data dir that holds bookie dirs (bookie-<i>, cluster's layout)
// beyond the first n: a restart with fewer --bookies would leave their entries, possibly the
// only copies, unserved without a word.
func checkBookieDirs(dataDir string, n int) error {
	dirs, err := os.ReadDir(dataDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("--data-dir: %w", err)
	}
	var left []string
	most := n
	for _, d := range dirs {
		i, err := strconv.Atoi(strings.TrimPrefix(d.Name(), "bookie-"))
		if d.IsDir() && strings.HasPrefix(d.Name(), "bookie-") && err == nil && i >= n {
			left = append(left, filepath.Join(dataDir, d.Name()))
			most = max(most, i+1)
		}
	}
	if len(left) == 0 {
		return nil
	}
	return fmt.Errorf("--bookies %d: %s holds the data of %d bookies; %s would be left out, and their entries may be "+
		"the only copies: start with --bookies %d (or more), or move those dirs away", n, dataDir, most, strings.Join(left, ", "), most)
}

// portFree reports an error if nothing can listen on 127.0.0.1:port.
func portFree(port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return err
	}
	return ln.Close()
}
