package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/pipeline"
	"github.com/ferry-llm/ferry/transfer"
	"github.com/ferry-llm/ferry/transfer/sshconn"
)

func transferCommand() *cli.Command {
	return &cli.Command{
		Name:      "transfer",
		Usage:     "copy files and directories to hosts over SSH, to local directories and to S3 buckets: parallel, sha256-verified, resumable",
		ArgsUsage: "SRC... DEST... (SRC: files and directories, or one s3://BUCKET/PREFIX/NAME; DEST: [user@]HOST:DIR, a local directory: /mnt/x, ./x, file:///mnt/x, or s3://BUCKET/PREFIX)",
		Description: `Each source (a file, or a directory sent as DIR/<its name>) goes to every
destination. Every file is hashed (sha256) before it is sent (a file
unchanged since an earlier run, by size, mtime and inode, keeps the digest
it had), written by --streams SSH connections at once into NAME.partial,
many small files at once, checked on the remote host (openssl, sha256sum
or shasum over SSH, one command for many files; reading it back where none
works), and renamed into place only when its digest matches. One listing
of each destination decides what is already there: a file an earlier run
verified and left is trusted by its size and mtime (--verify reads it
again), another there with the right size is hashed there, and skipped if
it matches. Chunks whose bytes are durable on the remote side are
journaled (in --state-dir), so a run that was interrupted, or lost its
connection, sends only what is missing when run again. Files under the
sources' directories at a destination that the sources do not have are
listed (--delete-extra removes them, as rsync --delete does). One
destination failing does not stop the others; the error and the --json
report say which failed.

A local destination (a disk, an external drive, an NFS or SMB mount) gets
the same: NAME.partial written at its offsets and fsynced, verified by
reading it again (past the page cache on a network file system), renamed,
journaled and resumed alike. An S3 destination (s3://BUCKET/PREFIX; the
endpoint, region and credentials read as every S3 tool reads them:
AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_PROFILE,
~/.aws/config) gets a file of one chunk as one put and a larger one as a
multipart upload whose parts are the chunks (--chunk-size at least 5MiB),
each with its SHA-256, which the server checks; the upload resumes from
the parts the server lists, completes only when every part matches, and
the object records the file's sha256 (x-amz-meta-ferry-sha256), which
--verify checks by reading the object again. Destinations start at the
first HOST:DIR, file:// or s3:// argument and may mix kinds; with none, the last argument is the one
destination (ferry transfer model/ /Volumes/T7/models). The first part of a split GGUF
(NAME-00001-of-0000N.gguf) brings every part of it.

The source may be S3 instead, one, first (every argument after it is a
destination): s3://BUCKET/PREFIX/NAME
is the object NAME (sent as the file NAME) or the objects under NAME/ (sent
as the directory NAME). They are read by ranged GETs, many at once, each
with If-Match of the ETag listed (an object replaced during the copy fails
that file alone, naming it, and nothing of it is renamed into place), each
chunk read once for every destination; a file is verified against the
sha256 ferry recorded in its metadata when it uploaded it, or hashed as it
is read (and remembered by ETag in --state-dir, so an unchanged object is
not read again). A resumed copy of a file whose sha256 is known fetches
only the chunks its destinations lack.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "streams", Value: 4, Usage: "SSH connections per destination"},
			&cli.IntFlag{Name: "sessions", Value: transfer.SessionsPerConn, Usage: "SFTP sessions (SSH channels) on each connection, each with a chunk buffer"},
			&cli.BoolFlag{Name: "dereference", Usage: "copy what symlinks point to (links inside a source tree are otherwise recreated as links, and links leaving it refused)"},
			&cli.StringFlag{Name: "chunk-size", Value: "16MiB", Usage: "unit of parallel writes, of the resume journal and of repair"},
			&cli.StringFlag{Name: "state-dir", Usage: "where resume journals are kept (default: the user cache directory's ferry/transfer)"},
			&cli.BoolFlag{Name: "verify", Usage: "re-hash remote files an earlier run verified, instead of trusting their size and mtime"},
			&cli.BoolFlag{Name: "delete-extra", Usage: "remove what a destination holds under the sources' directories that the sources do not (as rsync --delete)"},
			&cli.StringFlag{Name: "ssh-config", Usage: "read only this ssh_config (\"none\": no config)"},
			&cli.StringFlag{Name: "known-hosts", Usage: "the known_hosts file to check (and with --accept-new, to add to)"},
			&cli.StringSliceFlag{Name: "identity", Aliases: []string{"i"}, Usage: "identity file (private key), tried before the config's"},
			&cli.BoolFlag{Name: "accept-new", Usage: "trust and record the key of a host not in known_hosts yet (a changed key is always refused)"},
			&cli.StringFlag{Name: "via", Usage: "send through this interface: every SSH connection is bound to it, and a destination with no route through it fails before a byte is sent"},
			&cli.IntFlag{Name: "expect-mtu", Usage: "fail a destination whose egress MTU or path MTU is not this (netcheck), before a byte is sent"},
			&cli.BoolFlag{Name: "require-wired", Usage: "fail a destination whose route leaves by Wi-Fi (netcheck), before a byte is sent"},
			&cli.BoolFlag{Name: "skip-netcheck", Usage: "do not run the route, interface and MTU checks (ferry netcheck) before sending"},
			jobsFlag("files hashed at once before sending"),
			jsonFlag("print the report (per destination and file: bytes, seconds, MB/s, digest, verified) as JSON"),
		},
		Action: runTransfer,
	}
}

// transferPreFlight is netcheck's seam in the command (as the stage runs
// netcheck in pipeline): it runs before any connection is made, binds
// connections to --via's interface, and returns the check run before a
// byte is sent to each destination (route, MTU, Wi-Fi), whose failure
// fails that destination only.
var transferPreFlight = netcheckPreFlight

func runTransfer(c *cli.Context) error {
	srcs, dsts := splitTransferArgs(c.Args().Slice())
	var err error
	if len(srcs) == 0 || len(dsts) == 0 {
		return usageErrorf("transfer: want SRC... DEST... (DEST: [user@]HOST:DIR, a local directory, or s3://BUCKET/PREFIX)")
	}
	fromS3 := transfer.S3Source(srcs[0]) // then alone: splitTransferArgs
	if !fromS3 {
		if srcs, err = withSplitParts(srcs); err != nil {
			return err
		}
	}
	jobs, err := jobsOf(c)
	if err != nil {
		return err
	}
	streams := c.Int("streams")
	if streams < 1 || streams > transfer.MaxStreams {
		return usageErrorf("transfer: --streams must be between 1 and %d", transfer.MaxStreams)
	}
	sessions := c.Int("sessions")
	if sessions < 1 || sessions > transfer.MaxSessions {
		return usageErrorf("transfer: --sessions must be between 1 and %d", transfer.MaxSessions)
	}
	cs, ok := pipeline.ParseSize(c.String("chunk-size"))
	if !ok || cs < 64<<10 || cs > 1<<30 {
		return usageErrorf("transfer: --chunk-size %q: want a size from 64KiB to 1GiB", c.String("chunk-size"))
	}
	so := sshconn.Options{SSHConfigPath: c.String("ssh-config"), KnownHostsPath: c.String("known-hosts"),
		IdentityFiles: c.StringSlice("identity"), AcceptNew: c.Bool("accept-new")}
	var preFlight func(ctx context.Context, d transfer.Destination) error
	if transferPreFlight != nil {
		if preFlight, err = transferPreFlight(c, &so); err != nil {
			return err
		}
	}
	var dialer *sshconn.Dialer
	if slices.ContainsFunc(dsts, func(d string) bool { _, local := transfer.LocalDir(d); return !local && !transfer.IsS3(d) }) {
		if dialer, err = sshconn.NewDialer(so); err != nil {
			return err
		}
	}
	dests, err := transferDestinations(dialer, dsts)
	if err != nil {
		return err
	}
	if err := localDestsOutsideSources(srcs, dests); err != nil && !fromS3 {
		return err
	}
	state := c.String("state-dir")
	if state == "" {
		if state, err = transferStateDir(); err != nil {
			return err
		}
	}
	pg := newProgress(c, false)
	hashBar := pg.New("hashing", 0, "task", "hash")
	cache := transfer.OpenDigestCache(filepath.Join(state, transfer.DigestCacheFile))
	// Files are hashed as they are sent, from the one read that sends
	// them; before sending, only those a destination holds a file of
	// their size for (the bar counts these). An S3 source's objects are
	// listed; those without a recorded sha256 are hashed as they are read.
	po := transfer.PlanOptions{Dereference: c.Bool("dereference"), ChunkSize: cs, Jobs: jobs, Hashed: hashBar.Add, Cache: cache, HashLater: true}
	var plan *transfer.Plan
	if fromS3 {
		plan, err = transfer.NewS3Plan(c.Context, srcs[0], po)
	} else {
		plan, err = transfer.NewPlan(c.Context, srcs, po)
	}
	if err != nil {
		hashBar.Close()
		pg.Close()
		if r := interruptedResume(c.Context, err, "nothing was sent"); r != nil {
			return r
		}
		return err
	}
	o := transfer.Options{Streams: streams, Sessions: sessions, StateDir: state, Verify: c.Bool("verify"), DeleteExtra: c.Bool("delete-extra"),
		Progress: func(dest string, total int64) progress.Reporter { return pg.New(dest, total, "dest", dest) }}
	o.PreFlight = preFlight
	rep, err := transfer.Run(c.Context, plan, dests, o)
	hashBar.Close()
	pg.Close()
	cache.StoreObjects(plan) // an S3 source's objects hashed as they were read
	if serr := cache.Save(); serr != nil {
		slog.Warn("transfer: the digest cache was not saved (the next run hashes the sources again)", "err", serr)
	}
	if rep != nil {
		if perr := printTransfer(c, rep); perr != nil && err == nil {
			err = perr
		}
	}
	if err != nil && c.Context.Err() != nil {
		return &interruption{msg: "interrupted; nothing unverified was renamed into place; run the same command again to resume", err: err}
	}
	return err
}

// splitTransferArgs tells sources from destinations: the destinations
// start at the first argument that names one for sure (HOST:DIR,
// file://…), and local directories may follow it; where no argument does,
// the last one is the destination, as cp takes it.
func splitTransferArgs(args []string) (srcs, dsts []string) {
	if len(args) > 0 && transfer.S3Source(args[0]) {
		return args[:1], args[1:] // an S3 source, alone
	}
	for i, a := range args {
		if _, local := transfer.LocalDir(a); !local || strings.HasPrefix(a, "file://") {
			return args[:i], args[i:]
		}
	}
	if len(args) < 2 {
		return args, nil
	}
	return args[:len(args)-1], args[len(args)-1:]
}

// transferDestinations parses the [user@]HOST:DIR arguments into
// destinations that dial through d.
func transferDestinations(d *sshconn.Dialer, args []string) ([]transfer.Destination, error) {
	seen := map[string]bool{}
	var out []transfer.Destination
	for _, a := range args {
		if transfer.IsS3(a) {
			u := strings.TrimRight(a, "/")
			if seen[u] {
				return nil, usageErrorf("transfer: destination %s given twice", a)
			}
			seen[u] = true
			out = append(out, transfer.Destination{Name: u, Dir: u, S3: true})
			continue
		}
		if dir, ok := transfer.LocalDir(a); ok {
			abs, err := localDestDir(dir)
			if err != nil {
				return nil, err
			}
			if seen[abs] {
				return nil, usageErrorf("transfer: destination %s given twice", a)
			}
			seen[abs] = true
			out = append(out, transfer.Destination{Name: abs, Dir: abs, Local: true})
			continue
		}
		t, err := sshconn.ParseTarget(a)
		if err != nil {
			return nil, err
		}
		if seen[t.String()] {
			return nil, usageErrorf("transfer: destination %s given twice", a)
		}
		seen[t.String()] = true
		out = append(out, transfer.Destination{Name: t.String(), Host: t.HostString(), Dir: t.Dir,
			Dial: func(ctx context.Context) (*ssh.Client, error) { return d.Dial(ctx, t) }})
	}
	return out, nil
}

// localDestsOutsideSources refuses a local destination inside a source
// directory (each run would copy the last run's copy again, one level
// deeper, as cp -r refuses "a directory into itself"), and one where a
// source would land on itself.
func localDestsOutsideSources(srcs []string, dests []transfer.Destination) error {
	real := func(p string) string {
		abs, err := filepath.Abs(p)
		if err != nil {
			return p
		}
		if r, err := filepath.EvalSymlinks(abs); err == nil {
			return r
		}
		return abs
	}
	within := func(p, dir string) bool {
		rel, err := filepath.Rel(dir, p)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	for _, d := range dests {
		if !d.Local {
			continue
		}
		dd := real(d.Dir)
		for _, s := range srcs {
			ss := real(s)
			if within(dd, ss) {
				return usageErrorf("transfer: destination %s is inside source %s: each run would copy the last run's copy again", d.Dir, s)
			}
			if filepath.Join(dd, filepath.Base(ss)) == ss {
				return usageErrorf("transfer: source %s would be copied onto itself in %s", s, d.Dir)
			}
		}
	}
	return nil
}

// localDestDir makes a local destination's path absolute ("~" expanded:
// a file:// URL or a quoted path reaches us unexpanded).
func localDestDir(dir string) (string, error) {
	if dir == "" {
		return "", usageErrorf("transfer: empty destination path")
	}
	if dir == "~" || strings.HasPrefix(dir, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(home, dir[1:])
	}
	return filepath.Abs(dir)
}

// transferStateDir is where the CLI keeps transfer journals.
func transferStateDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("transfer: no cache directory for resume journals (give --state-dir): %w", err)
	}
	return filepath.Join(dir, "ferry", "transfer"), nil
}

// printTransfer prints a line per destination. A failed one says FAILED
// and no more: its error is the command's, printed once by main.
func printTransfer(c *cli.Context, rep *transfer.Report) error {
	if c.Bool("json") {
		return printJSON(c, rep)
	}
	w := stdout(c)
	for _, h := range rep.Hosts {
		var sent, skipped, verified int
		for _, f := range h.Files {
			switch {
			case f.Skipped:
				skipped++
			case f.Sent > 0:
				sent++
			}
			if f.Verified {
				verified++
			}
		}
		status := "ok"
		if !h.OK {
			status = "FAILED"
		}
		fmt.Fprintf(w, "%s: %s, %d of %d files verified (%s), %d sent, %d already there, %d bytes sent in %.1fs (%.1f MB/s)\n",
			h.Destination, status, verified, rep.Files, h.HashCommand, sent, skipped, h.Sent, h.Seconds, h.MBps)
		if len(h.Deleted) > 0 {
			fmt.Fprintf(w, "  deleted %d files that the sources do not have: %s\n", len(h.Deleted), listSome(h.Deleted))
		} else if len(h.Extra) > 0 {
			fmt.Fprintf(w, "  %d files there that the sources do not have (--delete-extra removes them): %s\n", len(h.Extra), listSome(h.Extra))
		}
	}
	return nil
}

// listSome is the first few of names, and how many more.
func listSome(names []string) string {
	if len(names) <= 5 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:5], ", "), len(names)-5)
}
