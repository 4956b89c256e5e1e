// Command toxiproxy-server is Shopify's Toxiproxy server (the module version pinned in go.mod)
// with one toxic added, "loss" (loss.go), for GenTorrent's wide-area testbed (docs/testbed.md).
// `make setup` builds it into .venv/bin/toxiproxy-server. Its API answers GET /version with the
// module's version and VersionSuffix, which is how overlay/tools/toxiproxy.py tells it from a
// stock server. Flags: -host, -port (the API's address), -seed (the random seed of the toxics'
// draws; default: the time), -version.
package main

import (
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/Shopify/toxiproxy/v2"
)

// VersionSuffix marks this build in GET /version.
const VersionSuffix = "+gentorrent-loss"

func moduleVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/Shopify/toxiproxy/v2" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

func main() {
	host := flag.String("host", "localhost", "address for the API to listen on")
	port := flag.String("port", "8474", "port for the API to listen on")
	seed := flag.Int64("seed", time.Now().UnixNano(), "seed for the toxics' random draws")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	toxiproxy.Version = moduleVersion() + VersionSuffix
	if *version {
		fmt.Printf("toxiproxy-server version %s\n", toxiproxy.Version)
		return
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	go func() {
		<-stop
		os.Exit(0)
	}()

	// The stock toxics (latency's jitter) draw from math/rand's global source, as upstream's
	// server seeds it (go.mod's go 1.22 keeps Seed working); the loss toxic has a source of its
	// own, locked because every connection's toxics draw from their own goroutines.
	rand.Seed(*seed) //nolint:staticcheck
	src := rand.New(rand.NewSource(*seed))
	var mu sync.Mutex
	draw = func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return src.Float64()
	}

	logger := zerolog.New(os.Stdout).With().Timestamp().Logger()
	if level, err := zerolog.ParseLevel(os.Getenv("LOG_LEVEL")); err == nil && os.Getenv("LOG_LEVEL") != "" {
		logger = logger.Level(level)
	}
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), logger)
	server.Listen(*host, *port)
}
