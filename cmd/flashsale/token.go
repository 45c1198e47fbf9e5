package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
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
		fmt.Fprintln(stdout, "Usage: flashsale token [--config FILE] [--ttl 24h] USER_ID\n\nPrints a shopper JWT signed with the config's auth.jwt_secret (HS256, with auth.issuer and auth.audience\nwhen set); with auth.jwks_url only when auth.algorithms lists HS256.")
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
	if cfg.Auth.JWKSURL != "" && !slices.Contains(cfg.Auth.Algorithms, "HS256") {
		return fmt.Errorf("token: auth.algorithms does not accept HS256 next to auth.jwks_url: tokens come from the identity provider")
	}
	if *ttl > cfg.Auth.MaxTokenLifetime {
		return fmt.Errorf("token: --ttl %s is beyond auth.max_token_lifetime (%s): the token would be refused", *ttl, cfg.Auth.MaxTokenLifetime)
	}
	// Minting needs no key set: the secret signs, and the configured
	// issuer and audience go in, so the token passes their checks.
	minter, err := auth.New(context.Background(), []byte(cfg.Auth.JWTSecret),
		auth.Options{Leeway: cfg.Auth.JWTLeeway, Issuer: cfg.Auth.Issuer, Audience: cfg.Auth.Audience})
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	tok, err := minter.Mint(fs.Arg(0), *ttl)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
