package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ringkeeper/ringkeeper/bookie"
)

func bookieCommand() *cobra.Command {
	var (
		confFile    string
		sets        []string
		journalDirs []string
		ledgerDirs  []string
		metadataURI string
		port        int
		httpPort    int
		logFormat   string
		logLevel    string
	)
	cmd := &cobra.Command{
		Use:   "bookie",
		Short: "Run a bookie",
		Long: `Runs one bookie. Settings come from --conf, a BookKeeper-style properties file
(key=value, BookKeeper's key names: bookiePort, journalDirectories, ledgerDirectories,
metadataServiceUri, journalMaxGroupWaitMSec, ...), then --set key=value, then the other flags.
An unknown key is a warning; a bad value is an error. SIGTERM or Ctrl-C shuts down gracefully.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(logFormat, logLevel)
			slog.SetDefault(log)
			cfg := bookie.DefaultConfig()
			cfg.Logger = log
			if confFile != "" {
				warnings, err := cfg.LoadFile(confFile)
				for _, w := range warnings {
					log.Warn(w, "file", confFile)
				}
				if err != nil {
					return err
				}
			}
			props := map[string]string{}
			for _, kv := range sets {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("--set %q: want key=value", kv)
				}
				props[k] = v
			}
			f := cmd.Flags()
			if f.Changed("journal-dirs") {
				props["journalDirectories"] = strings.Join(journalDirs, ",")
			}
			if f.Changed("ledger-dirs") {
				props["ledgerDirectories"] = strings.Join(ledgerDirs, ",")
			}
			if f.Changed("metadata") {
				props["metadataServiceUri"] = metadataURI
			}
			if f.Changed("port") {
				props["bookiePort"] = fmt.Sprint(port)
			}
			if f.Changed("http-port") {
				props["prometheusStatsHttpPort"] = fmt.Sprint(httpPort)
			}
			warnings, err := cfg.Apply(props)
			for _, w := range warnings {
				log.Warn(w)
			}
			if err != nil {
				return err
			}
			setMemoryLimit(cfg.CacheBytes(), log)
			b, err := bookie.Start(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "bookie %s ready on %s (metadata %s)\n", b.ID(), b.Addr(), cfg.MetadataServiceURI)
			<-cmd.Context().Done()
			log.Info("shutting down")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return b.Close(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&confFile, "conf", "", "properties file (bk_server.conf style)")
	f.StringArrayVar(&sets, "set", nil, "key=value setting, BookKeeper key names (repeatable)")
	f.StringSliceVar(&journalDirs, "journal-dirs", nil, "journalDirectories")
	f.StringSliceVar(&ledgerDirs, "ledger-dirs", nil, "ledgerDirectories")
	f.StringVar(&metadataURI, "metadata", "", "metadataServiceUri, e.g. etcd://127.0.0.1:2379/ledgers")
	f.IntVar(&port, "port", 3181, "bookiePort")
	f.IntVar(&httpPort, "http-port", 8000, "prometheusStatsHttpPort (metrics and admin API; 0 = off)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

func newLogger(format, level string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
