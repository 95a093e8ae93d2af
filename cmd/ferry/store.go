package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline"
	"github.com/ferry-llm/ferry/store"
)

func storeCommand() *cli.Command {
	return &cli.Command{
		Name:  "store",
		Usage: "verify, measure and garbage-collect the content-addressed store",
		Subcommands: []*cli.Command{
			{
				Name:      "verify",
				Usage:     "re-hash every blob and check every record (exit 3 on damage)",
				ArgsUsage: "STORE_DIR | PIPELINE.yaml | s3://BUCKET/PREFIX",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "repair", Usage: "shared store: remove each blob whose bytes do not hash to its name (hashed twice), so the next run makes its stages again (a pipeline's own store needs no flag: its next run does)"},
					jsonFlag("print the result as JSON"),
				},
				Action: storeVerify,
			},
			{
				Name:  "du",
				Usage: "show what each stage's outputs hold in the store and read in place, and what gc would free",
				Description: "Per record: bytes held as blobs in the store (shared: also held by another record),\n" +
					"bytes read in place from imported files outside it, and whether a pipeline stage still\n" +
					"points at it; then what 'store gc' and 'store gc --prune-records' would free. gc never\n" +
					"frees an imported file read in place (it removes only the link). A blob cloned from an\n" +
					"import (reflinks) counts its full size though it shares its blocks with the file. Reads no\n" +
					"file data and takes no lock.",
				ArgsUsage: "STORE_DIR | PIPELINE.yaml | s3://BUCKET/PREFIX",
				Flags: []cli.Flag{
					jsonFlag("print the result as JSON"),
				},
				Action: storeDU,
			},
			{
				Name:      "gc",
				Usage:     "remove blobs no record refers to, and leftover temp files",
				ArgsUsage: "STORE_DIR | PIPELINE.yaml | s3://BUCKET/PREFIX",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "journals", Usage: "also remove the resume state (journals, work dirs) of unfinished stages"},
					&cli.BoolFlag{Name: "prune-records", Usage: "first drop records no pipeline stage points at (old parameters or inputs)"},
					&cli.DurationFlag{Name: "grace", Value: store.DefaultGCGrace, Usage: "shared store: keep unreferenced blobs and unfinished uploads younger than this (by the server's clock)"},
					dryRunFlag("say what would be removed, remove nothing"),
					jsonFlag("print the result as JSON"),
				},
				Action: storeGC,
			},
			storeDoctorCommand(),
			storeCopyCommand(),
		},
	}
}

// loadStoreArg loads the store named by a store directory or a pipeline
// file, without locking it.
func loadStoreArg(c *cli.Context) (*manifest.Store, error) {
	if c.NArg() != 1 {
		return nil, usageErrorf("%s: want a store directory or a pipeline file, got %d arguments", commandPath(c), c.NArg())
	}
	arg := storeArg(c.Args().First())
	fi, err := os.Stat(arg)
	if err != nil {
		return nil, err
	}
	dir := arg
	if !fi.IsDir() {
		spec, err := pipeline.Load(arg, pipeline.WithKinds(stageKinds()))
		if err != nil {
			return nil, err
		}
		dir = spec.Store
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs", manifest.Algorithm)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, usageErrorf("%s: not a ferry store (no blobs/%s)", dir, manifest.Algorithm)
		}
		return nil, err
	}
	return manifest.Load(dir)
}

// openStoreArg opens the store named by a store directory or a pipeline
// file, and takes its lock.
func openStoreArg(c *cli.Context) (*manifest.Store, *manifest.Lock, error) {
	s, err := loadStoreArg(c)
	if err != nil {
		return nil, nil, err
	}
	lock, err := lockStore(c, s)
	if err != nil {
		return nil, nil, err
	}
	return s, lock, nil
}

// lockStore takes s's lock and reads it again; a store of an older format
// is converted once, now that the lock is held.
func lockStore(c *cli.Context, s *manifest.Store) (*manifest.Lock, error) {
	lock, err := s.TryLock(c.App.Name + " " + commandPath(c))
	if err != nil {
		return nil, err
	}
	if err := s.Reload(); err != nil {
		lock.Unlock()
		return nil, err
	}
	if err := s.SaveUpgrade(); err != nil {
		lock.Unlock()
		return nil, err
	}
	return lock, nil
}

func storeVerify(c *cli.Context) error {
	if arg, ok := sharedStoreArg(c); ok {
		return sharedVerify(c, arg)
	}
	if c.Bool("repair") {
		return usageErrorf("%s --repair: for a shared store; a pipeline's own store marks what verify finds damaged, and its next run makes those stages again", commandPath(c))
	}
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
		inPlace := ""
		if rep.InPlace > 0 {
			inPlace = fmt.Sprintf(" (%d, %d bytes, read in place from imported files)", rep.InPlace, rep.InPlaceBytes)
		}
		fmt.Fprintf(w, "store %s: %d blobs (%d bytes) re-hashed%s, %d records checked, %d unreferenced blobs\n",
			s.Root, rep.Blobs, rep.Bytes, inPlace, rep.Records, rep.Unreferenced)
		for _, p := range rep.Problems {
			fmt.Fprintf(w, "  DAMAGED %s\n", p)
		}
	}
	if !rep.OK() {
		return verifyFailed(fmt.Errorf("store %s: %s; 'ferry pipeline plan' shows which stages must re-run", s.Root, plural(len(rep.Problems), "problem")))
	}
	return nil
}

func storeGC(c *cli.Context) error {
	if arg, ok := sharedStoreArg(c); ok {
		return sharedGC(c, arg)
	}
	if c.IsSet("grace") {
		return usageErrorf("%s --grace: a pipeline's store is collected under its lock, where no stage writes beside gc, so no grace period applies (--grace is for a shared store)", commandPath(c))
	}
	if c.Bool("dry-run") {
		return storeGCDryRun(c)
	}
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
	aborted := ""
	if rep.AbortedUploads > 0 {
		aborted = fmt.Sprintf(", aborted %d unfinished uploads", rep.AbortedUploads)
	}
	fmt.Fprintf(c.App.Writer, "store %s: pruned %d records, removed %d blobs (%d bytes) and %d temp entries%s; kept %d blobs\n",
		s.Root, rep.PrunedRecords, rep.RemovedBlobs, rep.RemovedBytes, rep.RemovedTemp, aborted, rep.KeptBlobs)
	return nil
}

// gcDryRun is what `store gc --dry-run` says of a pipeline's store.
type gcDryRun struct {
	Store  string `json:"store"`
	DryRun bool   `json:"dry_run"`
	// Records, Blobs and Bytes would be removed (Bytes counts leftover
	// temp files too; never the imported files read in place: only
	// their links go).
	Records int   `json:"pruned_records"`
	Blobs   int   `json:"removed_blobs"`
	Bytes   int64 `json:"removed_bytes"`
	// ResumeBytes: the resume state --journals would remove.
	ResumeBytes int64 `json:"removed_resume_bytes,omitempty"`
}

// storeGCDryRun says what gc would remove from a pipeline's store, from
// what `store du` reads (no lock, nothing removed).
func storeGCDryRun(c *cli.Context) error {
	s, du, err := loadStoreDU(c)
	if err != nil {
		return err
	}
	free := du.GC
	if c.Bool("prune-records") {
		free = du.GCPrune
	}
	rep := gcDryRun{Store: s.Root, DryRun: true, Records: free.Records, Blobs: free.Blobs, Bytes: free.Bytes}
	if c.Bool("journals") {
		rep.ResumeBytes = du.ResumeBytes
	}
	if c.Bool("json") {
		return printJSON(c, rep)
	}
	journals := ""
	if c.Bool("journals") {
		journals = fmt.Sprintf(", and %s of unfinished stages' resume state", sizeText(rep.ResumeBytes))
	}
	fmt.Fprintf(c.App.Writer, "store %s: would prune %d records and remove %d blobs (%s, temp files included)%s; nothing removed\n",
		s.Root, rep.Records, rep.Blobs, sizeText(rep.Bytes), journals)
	return nil
}

// loadStoreDU loads the pipeline store the command names and measures it.
func loadStoreDU(c *cli.Context) (*manifest.Store, *manifest.DiskUsage, error) {
	s, err := loadStoreArg(c)
	if err != nil {
		return nil, nil, err
	}
	du, err := s.DiskUsage()
	return s, du, err
}

func storeDU(c *cli.Context) error {
	if arg, ok := sharedStoreArg(c); ok {
		return sharedDU(c, arg)
	}
	_, du, err := loadStoreDU(c)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, du)
	}
	w := stdout(c)
	fmt.Fprintf(w, "store %s\n", du.Store)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "stage\tkey\tin blobs\tshared\tin place\tmissing\t\n")
	for _, u := range du.Stages {
		name := u.Stage
		if u.Pipeline != "" {
			name = u.Pipeline + "/" + u.Stage
		}
		if !u.Live {
			name += " (old)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", name, u.Key[:min(12, len(u.Key))], sizeText(u.BlobBytes),
			sizeText(u.SharedBytes), sizeText(u.InPlaceBytes), sizeText(u.MissingBytes))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "total: %s in blobs, %s read in place (not in the store), %s of resume state (gc --journals), %s of temp files\n",
		sizeText(du.BlobBytes), sizeText(du.InPlaceBytes), sizeText(du.ResumeBytes), sizeText(du.TempBytes))
	fmt.Fprintf(w, "gc would free %s (%d blobs); gc --prune-records %s (%d records, %d blobs)\n",
		sizeText(du.GC.Bytes), du.GC.Blobs, sizeText(du.GCPrune.Bytes), du.GCPrune.Records, du.GCPrune.Blobs)
	return nil
}

// sizeText is n bytes for people: "0 B", "812 B", "4.2 MB", "1.46 GB"
// (powers of 1000, as du -h --si).
func sizeText(n int64) string {
	if n < 1000 {
		return fmt.Sprintf("%d B", n)
	}
	f, units := float64(n), []string{"kB", "MB", "GB", "TB", "PB"}
	for i := range units {
		f /= 1000
		if f < 1000 || i == len(units)-1 {
			return strconv.FormatFloat(f, 'f', max(0, 2-int(math.Log10(f))), 64) + " " + units[i]
		}
	}
	return ""
}
