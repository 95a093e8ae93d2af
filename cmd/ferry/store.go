package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline"
)

func storeCommand() *cli.Command {
	return &cli.Command{
		Name:  "store",
		Usage: "verify and garbage-collect the content-addressed store",
		Subcommands: []*cli.Command{
			{
				Name:      "verify",
				Usage:     "re-hash every blob and check every record (exit 3 on damage)",
				ArgsUsage: "STORE_DIR | PIPELINE.yaml",
				Flags: []cli.Flag{
					jsonFlag("print the result as JSON"),
				},
				Action: storeVerify,
			},
			{
				Name:      "gc",
				Usage:     "remove blobs no record refers to, and leftover temp files",
				ArgsUsage: "STORE_DIR | PIPELINE.yaml",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "journals", Usage: "also remove the resume state (journals, work dirs) of unfinished stages"},
					&cli.BoolFlag{Name: "prune-records", Usage: "first drop records no pipeline stage points at (old parameters or inputs)"},
					jsonFlag("print the result as JSON"),
				},
				Action: storeGC,
			},
		},
	}
}

// openStoreArg opens the store named by a store directory or a pipeline
// file, and takes its lock.
func openStoreArg(c *cli.Context) (*manifest.Store, *manifest.Lock, error) {
	if c.NArg() != 1 {
		return nil, nil, usageErrorf("%s: want a store directory or a pipeline file, got %d arguments", c.Command.FullName(), c.NArg())
	}
	arg := c.Args().First()
	fi, err := os.Stat(arg)
	if err != nil {
		return nil, nil, err
	}
	dir := arg
	if !fi.IsDir() {
		spec, err := pipeline.Load(arg)
		if err != nil {
			return nil, nil, err
		}
		dir = spec.Store
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs", manifest.Algorithm)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, usageErrorf("%s: not a ferry store (no blobs/%s)", dir, manifest.Algorithm)
		}
		return nil, nil, err
	}
	s, err := manifest.Load(dir)
	if err != nil {
		return nil, nil, err
	}
	lock, err := s.TryLock("ferry " + c.Command.FullName())
	if err != nil {
		return nil, nil, err
	}
	if err := s.Reload(); err != nil {
		lock.Unlock()
		return nil, nil, err
	}
	return s, lock, nil
}

func storeVerify(c *cli.Context) error {
	s, lock, err := openStoreArg(c)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	pg := newProgress(c, false)
	bar := pg.New("re-hashing", -1, "task", "store verify")
	rep, err := s.Verify(c.Context, bar.Add)
	bar.Close()
	pg.Close()
	if err != nil {
		return err
	}
	w := c.App.Writer
	if c.Bool("json") {
		if err := printJSON(c, rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(w, "store %s: %d blobs (%d bytes) re-hashed, %d records checked, %d unreferenced blobs\n",
			s.Root, rep.Blobs, rep.Bytes, rep.Records, rep.Unreferenced)
		for _, p := range rep.Problems {
			fmt.Fprintf(w, "  DAMAGED %s\n", p)
		}
	}
	if !rep.OK() {
		return verifyFailed(fmt.Errorf("store %s: %d problems; 'ferry pipeline plan' shows which stages must re-run", s.Root, len(rep.Problems)))
	}
	return nil
}

func storeGC(c *cli.Context) error {
	s, lock, err := openStoreArg(c)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	gc := s.GC
	if c.Bool("prune-records") {
		gc = s.GCPrune
	}
	rep, err := gc(c.Bool("journals"))
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, rep)
	}
	fmt.Fprintf(c.App.Writer, "store %s: pruned %d records, removed %d blobs (%d bytes) and %d temp entries; kept %d blobs\n",
		s.Root, rep.PrunedRecords, rep.RemovedBlobs, rep.RemovedBytes, rep.RemovedTemp, rep.KeptBlobs)
	return nil
}
