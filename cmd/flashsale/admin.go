package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
)

// adminTokenEnv is where `flashsale admin` takes the admin token from when
// --admin-token is not given: the same variable that sets the server's.
const adminTokenEnv = "FLASHSALE_AUTH_ADMIN_TOKEN"

const adminUsage = `Usage: flashsale admin campaigns <command> [flags] [ID]

Manages campaigns over the admin API of a running gateway (--url, default
http://localhost:8080), with --admin-token or $FLASHSALE_AUTH_ADMIN_TOKEN.

Commands:
  list     [--state upcoming|running|paused|ended] [--limit N] [--all]
  get      ID
  create   --id ID --name NAME --stock N --limit N --start RFC3339 --end RFC3339 [--price N] [--payment-window 10m]
  patch    ID [--name NAME] [--limit N] [--payment-window D] [--start T] [--end T]   (only the name once started)
  preload  ID [--force]
  pause    ID
  resume   ID
  end      ID        end the sale now; requests still queued are rejected (ended_early)
  delete   ID        only before the start, with nothing admitted
  stats    ID

Every command but list prints the API's JSON answer; an error answer is
printed as "STATUS code: message" and exits non-zero.
`

// runAdmin runs `flashsale admin campaigns …`.
func runAdmin(ctx context.Context, args []string, stdout io.Writer, env map[string]string) error {
	if len(args) < 2 || args[0] != "campaigns" {
		fmt.Fprint(stdout, adminUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return nil
		}
		return errors.New("admin: want `admin campaigns <command>`")
	}
	cmd, rest := args[1], args[2:]
	fs := flag.NewFlagSet("admin campaigns "+cmd, flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() { fmt.Fprint(stdout, adminUsage); fs.PrintDefaults() }
	base := fs.String("url", "http://localhost:8080", "the gateway's base URL (its admin listener when http.admin_addr is set)")
	token := fs.String("admin-token", "", "the admin token (default $"+adminTokenEnv+")")
	a := &adminClient{ctx: ctx, out: stdout}
	var run func(id string) error
	needID := true
	switch cmd {
	case "list":
		needID = false
		state := fs.String("state", "", "only campaigns in this state")
		limit := fs.Int("limit", 0, "campaigns per page (1..100, default 20)")
		all := fs.Bool("all", false, "follow every page")
		run = func(string) error { return a.list(*state, *limit, *all) }
	case "get", "stats":
		run = func(id string) error {
			path := "/admin/v1/campaigns/" + url.PathEscape(id)
			if cmd == "stats" {
				path += "/stats"
			}
			return a.print("GET", path, nil)
		}
	case "create":
		needID = false
		id := fs.String("id", "", "campaign id [A-Za-z0-9_-]{1,64}")
		name := fs.String("name", "", "display name")
		stock := fs.Int64("stock", 0, "units on sale")
		limit := fs.Int64("limit", 1, "units one shopper may buy")
		price := fs.Int64("price", 0, "unit price in minor units (cents)")
		window := fs.String("payment-window", "", "how long a buyer has to pay (Go duration; default 10m)")
		start := fs.String("start", "", "sale start, RFC 3339")
		end := fs.String("end", "", "sale end, RFC 3339")
		run = func(string) error {
			body := map[string]any{"id": *id, "name": *name, "stock": *stock, "per_user_limit": *limit,
				"price": *price, "start_at": *start, "end_at": *end}
			if *window != "" {
				body["payment_window"] = *window
			}
			return a.print("POST", "/admin/v1/campaigns", body)
		}
	case "patch":
		name := fs.String("name", "", "new display name")
		limit := fs.Int64("limit", 0, "new per-user limit (before the start only)")
		window := fs.String("payment-window", "", "new payment window (before the start only)")
		start := fs.String("start", "", "new sale start, RFC 3339 (before the start only)")
		end := fs.String("end", "", "new sale end, RFC 3339 (before the start only)")
		run = func(id string) error {
			// Only the flags given are sent: an absent field stays.
			body := map[string]any{}
			fields := map[string]string{"name": "name", "limit": "per_user_limit", "payment-window": "payment_window",
				"start": "start_at", "end": "end_at"}
			values := map[string]any{"name": *name, "limit": *limit, "payment-window": *window, "start": *start, "end": *end}
			fs.Visit(func(f *flag.Flag) {
				if field, ok := fields[f.Name]; ok {
					body[field] = values[f.Name]
				}
			})
			return a.print("PATCH", "/admin/v1/campaigns/"+url.PathEscape(id), body)
		}
	case "preload":
		force := fs.Bool("force", false, "load again after the start (from the ledger: never sells what orders hold)")
		run = func(id string) error {
			path := "/admin/v1/campaigns/" + url.PathEscape(id) + "/preload"
			if *force {
				path += "?force=true"
			}
			return a.print("POST", path, nil)
		}
	case "pause", "resume", "end":
		run = func(id string) error { return a.print("POST", "/admin/v1/campaigns/"+url.PathEscape(id)+"/"+cmd, nil) }
	case "delete":
		run = func(id string) error { return a.print("DELETE", "/admin/v1/campaigns/"+url.PathEscape(id), nil) }
	default:
		fmt.Fprint(stdout, adminUsage)
		return fmt.Errorf("admin campaigns: unknown command %q", cmd)
	}
	// The ID may come before the flags or after them.
	var id string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		id, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if id == "" && fs.NArg() > 0 {
		id = fs.Arg(0)
	}
	switch {
	case needID && id == "":
		return fmt.Errorf("admin campaigns %s: want a campaign ID", cmd)
	case fs.NArg() > 1 || (!needID && fs.NArg() > 0) || (id != "" && fs.NArg() > 0 && fs.Arg(0) != id):
		return fmt.Errorf("admin campaigns %s: unexpected arguments %q", cmd, fs.Args())
	}
	a.base = strings.TrimRight(*base, "/")
	a.token = *token
	if a.token == "" {
		a.token = env[adminTokenEnv]
	}
	if a.token == "" {
		return fmt.Errorf("admin campaigns %s: no admin token: give --admin-token or set %s", cmd, adminTokenEnv)
	}
	return run(id)
}

// adminClient calls the admin API.
type adminClient struct {
	ctx   context.Context
	out   io.Writer
	base  string
	token string
}

// call sends a request and decodes a 2xx answer into out (unless nil); any
// other answer is an error naming its status, code and message.
func (a *adminClient) call(method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(a.ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("admin: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("admin: %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct{ Code, Message string }
		if json.Unmarshal(raw, &e) != nil || e.Code == "" {
			return fmt.Errorf("admin: %s %s: %s", method, path, resp.Status)
		}
		return fmt.Errorf("admin: %s %s: %d %s: %s", method, path, resp.StatusCode, e.Code, e.Message)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("admin: %s %s: answer: %w", method, path, err)
		}
	}
	return nil
}

// print calls the API and prints its JSON answer indented ("ok" for none).
func (a *adminClient) print(method, path string, body any) error {
	var out json.RawMessage
	if err := a.call(method, path, body, &out); err != nil {
		return err
	}
	if len(out) == 0 {
		fmt.Fprintln(a.out, "ok")
		return nil
	}
	var b bytes.Buffer
	if err := json.Indent(&b, out, "", "  "); err != nil {
		return err
	}
	fmt.Fprintln(a.out, b.String())
	return nil
}

// list prints campaigns as a table, one page or (all) every page.
func (a *adminClient) list(state string, limit int, all bool) error {
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSTOCK\tLIMIT\tPRICE\tSTART\tEND\tNAME")
	cursor := ""
	for {
		q := url.Values{}
		if state != "" {
			q.Set("state", state)
		}
		if limit != 0 {
			q.Set("limit", fmt.Sprint(limit))
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Campaigns []struct {
				ID           string    `json:"id"`
				Name         string    `json:"name"`
				State        string    `json:"state"`
				Stock        int64     `json:"stock"`
				PerUserLimit int64     `json:"per_user_limit"`
				Price        int64     `json:"price"`
				StartAt      time.Time `json:"start_at"`
				EndAt        time.Time `json:"end_at"`
			} `json:"campaigns"`
			NextCursor string `json:"next_cursor"`
		}
		if err := a.call("GET", "/admin/v1/campaigns?"+q.Encode(), nil, &page); err != nil {
			return err
		}
		for _, c := range page.Campaigns {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", c.ID, c.State, c.Stock, c.PerUserLimit, c.Price,
				c.StartAt.Format(time.RFC3339), c.EndAt.Format(time.RFC3339), c.Name)
		}
		cursor = page.NextCursor
		if !all || cursor == "" {
			break
		}
	}
	if cursor != "" {
		fmt.Fprintf(tw, "(more: --all)\n")
	}
	return tw.Flush()
}
