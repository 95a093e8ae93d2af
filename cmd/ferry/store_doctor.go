package main

import (
	"context"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
	s3store "github.com/ferry-llm/ferry/store/s3"
)

func storeDoctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "probe whether a store's storage honours conditional writes (what sharing it between machines needs)",
		Description: "Writes and removes a few scratch objects under probe/: create-only writes, If-Match\n" +
			"compare-and-swap, a body that does not match its SHA-256, multipart uploads with per-part\n" +
			"SHA-256 and create-only completion, the server's clock, conditional delete. Exits 2 when a\n" +
			"required check fails: such a server would let two machines overwrite each other's work.\n" +
			"An s3:// store reads its endpoint, region and credentials as every S3 tool does:\n" +
			"AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,\n" +
			"AWS_PROFILE, ~/.aws/config and ~/.aws/credentials.",
		ArgsUsage: "s3://BUCKET/PREFIX | DIR",
		Flags:     []cli.Flag{jsonFlag("print the probe as JSON")},
		Action:    storeDoctor,
	}
}

// openBackend opens the storage an argument names: s3://BUCKET/PREFIX, or
// an existing directory.
func openBackend(ctx context.Context, arg string) (store.Backend, error) {
	if s3store.IsURL(arg) {
		return s3store.Open(ctx, arg)
	}
	fi, err := os.Stat(arg)
	if err != nil {
		return nil, errkind.Mark(errkind.BadInput, err)
	}
	if !fi.IsDir() {
		return nil, usageErrorf("%s: not a directory or an s3:// URL", arg)
	}
	return local.New(arg)
}

func storeDoctor(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageErrorf("%s: want one store (s3://BUCKET/PREFIX or a directory), got %d arguments", commandPath(c), c.NArg())
	}
	b, err := openBackend(c.Context, storeArg(c.Args().First()))
	if err != nil {
		return err
	}
	rep := store.Probe(c.Context, b)
	if c.Bool("json") {
		if err := printJSON(c, rep); err != nil {
			return err
		}
	} else {
		w := c.App.Writer
		fmt.Fprintf(w, "store %s", rep.Store)
		if sb, ok := b.(*s3store.Backend); ok {
			fmt.Fprintf(w, " (endpoint %s)", sb.Endpoint())
		}
		fmt.Fprintln(w)
		for _, ch := range rep.Checks {
			word := "ok  "
			switch {
			case !ch.OK && ch.Required:
				word = "FAIL"
			case !ch.OK:
				word = "no  "
			}
			line := fmt.Sprintf("  %s  %s", word, ch.Name)
			if ch.Detail != "" {
				line += ": " + ch.Detail
			}
			fmt.Fprintln(w, line)
		}
		if rep.OK {
			fmt.Fprintln(w, "conditional writes are honoured: machines can share this store")
		}
	}
	if c.Context.Err() != nil {
		return c.Context.Err()
	}
	return rep.Err()
}
