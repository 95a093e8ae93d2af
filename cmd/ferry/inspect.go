package main

import (
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/inspect"
)

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "summarise a safetensors file or checkpoint directory (or a GGUF file), tensor by tensor",
		ArgsUsage: "PATH",
		Description: "PATH is a .safetensors file, a Hugging Face checkpoint directory (model.safetensors or\n" +
			"shards + model.safetensors.index.json), a PEFT adapter directory, or a .gguf file.\n" +
			"Prints a summary (architecture, tensors, parameters, bytes per dtype, shards, MTP tensors)\n" +
			"and a per-tensor table (name, dtype, shape, bytes, shard, absolute data offset).",
		Flags: []cli.Flag{
			jsonFlag("print the summary and rows as JSON"),
			&cli.BoolFlag{Name: "hash", Usage: "add each tensor's sha256 (reads every byte)"},
			jobsFlag("tensors hashed in parallel with --hash"),
			&cli.StringFlag{Name: "parquet", Usage: "also write the per-tensor table as Parquet to `FILE`"},
			followLinksFlag(),
			lockWaitFlag("the --parquet file"),
		},
		Action: runInspect,
	}
}

func runInspect(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageErrorf("inspect: want exactly one PATH, got %d arguments", c.NArg())
	}
	if _, err := jobsOf(c); err != nil {
		return err
	}
	path := c.Args().First()
	if _, err := os.Stat(path); err != nil {
		return err
	}
	if err := checkParquetDest(c.String("parquet")); err != nil {
		return err
	}
	if p := c.String("parquet"); p != "" {
		release, err := claimOutput(c, p, false, path)
		if err != nil {
			return err
		}
		defer release()
	}
	opts := inspect.Options{FollowLinks: c.Bool("follow-links"), Hash: c.Bool("hash"), Jobs: c.Int("jobs")}
	if opts.Hash {
		pg := newProgress(c, false)
		defer pg.Close()
		opts.Progress = pg.New("hashing", -1, "task", "inspect --hash")
	}
	rep, err := inspect.Path(c.Context, path, opts)
	if opts.Progress != nil {
		opts.Progress.Close()
	}
	if err != nil {
		return err
	}
	if p := c.String("parquet"); p != "" {
		if err := inspect.WriteParquet(p, rep.Tensors, "ferry "+version); err != nil {
			return err
		}
	}
	if c.Bool("json") {
		return printJSON(c, rep)
	}
	return rep.WriteText(stdout(c))
}

// checkParquetDest fails early, before any hashing, when --parquet names a
// directory or a file in a directory that does not exist.
func checkParquetDest(p string) error {
	if p == "" {
		return nil
	}
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		return usageErrorf("inspect: --parquet %s is a directory", p)
	}
	if st, err := os.Stat(filepath.Dir(p)); err != nil || !st.IsDir() {
		return usageErrorf("inspect: --parquet %s: directory %s does not exist", p, filepath.Dir(p))
	}
	return nil
}
