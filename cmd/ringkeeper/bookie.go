package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ringkeeper/ringkeeper/bookie"
)

// bookieFlags are `ringkeeper bookie`'s settings flags.
type bookieFlags struct {
	confFile    string
	sets        []string
	journalDirs []string
	ledgerDirs  []string
	metadataURI string
	port        int
	httpPort    int
}

func (b *bookieFlags) register(f *pflag.FlagSet) {
	f.StringVar(&b.confFile, "conf", "", "properties file (bk_server.conf style)")
	f.StringArrayVar(&b.sets, "set", nil, "key=value setting, BookKeeper key names (repeatable)")
	f.StringSliceVar(&b.journalDirs, "journal-dirs", nil, "journalDirectories")
	f.StringSliceVar(&b.ledgerDirs, "ledger-dirs", nil, "ledgerDirectories")
	f.StringVar(&b.metadataURI, "metadata", "", "metadataServiceUri, e.g. etcd://127.0.0.1:2379/ledgers")
	f.IntVar(&b.port, "port", 3181, "bookiePort")
	f.IntVar(&b.httpPort, "http-port", 8000, "prometheusStatsHttpPort (metrics and admin API; 0 = off)")
}

// config builds the bookie's config: the file, then --set, then the other flags. The layers
// make one set of properties, applied once: a key set in two layers takes the later value, and
// a rule between keys (journalDirectories over the deprecated journalDirectory) sees them all.
func (b *bookieFlags) config(f *pflag.FlagSet) (cfg bookie.Config, warnings []string, err error) {
	cfg = bookie.DefaultConfig()
	props := map[string]string{}
	if b.confFile != "" {
		if props, err = bookie.ReadProperties(b.confFile); err != nil {
			return cfg, nil, err
		}
	}
	for _, kv := range b.sets {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return cfg, nil, fmt.Errorf("--set %q: want key=value", kv)
		}
		props[k] = v
	}
	if f.Changed("journal-dirs") {
		props["journalDirectories"] = strings.Join(b.journalDirs, ",")
	}
	if f.Changed("ledger-dirs") {
		props["ledgerDirectories"] = strings.Join(b.ledgerDirs, ",")
	}
	if f.Changed("metadata") {
		props["metadataServiceUri"] = b.metadataURI
	}
	if f.Changed("port") {
		props["bookiePort"] = fmt.Sprint(b.port)
	}
	if f.Changed("http-port") {
		props["prometheusStatsHttpPort"] = fmt.Sprint(b.httpPort)
	}
	warnings, err = cfg.Apply(props)
	return cfg, warnings, err
}

func bookieCommand() *cobra.Command {
	var (
		flags     bookieFlags
		logFormat string
		logLevel  string
	)
	cmd := &cobra.Command{
		Use:   "bookie",
		Short: "Run a bookie",
		Long: `Runs one bookie. Settings come from --conf, a BookKeeper-style properties file
(key=value, BookKeeper's key names: bookiePort, journalDirectories, ledgerDirectories,
metadataServiceUri, journalMaxGroupWaitMSec, ...), then --set key=value, then the other flags.
An unknown key is a warning; a bad value is an error. SIGTERM or Ctrl-C shuts down gracefully.`,
		// Flags only: "bookie bk_server.conf", the --conf forgotten, must not start a bookie
		// with the default settings.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return err
			}
			slog.SetDefault(log)
			cfg, warnings, err := flags.config(cmd.Flags())
			for _, w := range warnings {
				log.Warn(w)
			}
			if err != nil {
				return err
			}
			cfg.Logger = log
			setMemoryLimit(cfg.MemoryBudget(), log)
			b, err := bookie.Start(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "bookie %s ready on %s (metadata %s)\n", b.ID(), b.Addr(), cfg.MetadataServiceURI)
			select {
			case <-cmd.Context().Done():
			case <-b.Done(): // it stopped itself (full disks with readOnlyModeEnabled=false, ...)
				return b.Err()
			}
			log.Info("shutting down")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return b.Close(ctx)
		},
	}
	f := cmd.Flags()
	flags.register(f)
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

// newLogger returns a logger to stderr; format and level are the values of --log-format and
// --log-level, an error names the flag.
func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
