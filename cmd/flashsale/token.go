package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/flashsale/flashsale/internal/auth"
	"github.com/flashsale/flashsale/internal/config"
)

func runToken(args []string, stdout io.Writer, env map[string]string) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stdout)
	configPath := fs.String("config", "", "config file (default: the built-in embedded config)")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "Usage: flashsale token [--config FILE] [--ttl 24h] USER_ID\n\nPrints a shopper JWT signed with the config's auth.jwt_secret.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("token: want exactly one USER_ID")
	}
	cfg, err := config.Load(*configPath, env)
	if err != nil {
		return err
	}
	tok, err := auth.NewJWT([]byte(cfg.Auth.JWTSecret), cfg.Auth.JWTLeeway).Mint(fs.Arg(0), *ttl)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
