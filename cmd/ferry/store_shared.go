package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
	s3store "github.com/ferry-llm/ferry/store/s3"
)

// The store commands on a shared store (package store): an s3:// URL, or
// a directory in the shared layout (it has a "format" object and no
// manifest.json: a pipeline's local store has both, and verify, gc and du
// read it with this machine's facts, through package manifest).

// storeArg is a store argument with the file:// of a directory's URL
// (as a pipeline file's store: names it) taken off.
func storeArg(arg string) string {
	if p, ok := strings.CutPrefix(arg, "file://"); ok {
		return p
	}
	return arg
}

// sharedStoreArg reports whether the command's one argument names a
// shared store.
func sharedStoreArg(c *cli.Context) (string, bool) {
	if c.NArg() != 1 {
		return "", false
	}
	arg := storeArg(c.Args().First())
	if s3store.IsURL(arg) {
		return arg, true
	}
	if _, err := os.Stat(filepath.Join(arg, "format")); err == nil {
		if _, err := os.Stat(filepath.Join(arg, "manifest.json")); err != nil {
			return arg, true
		}
	}
	// A pipeline file whose store: is shared names that store (its cache
	// is a directory of its own, named as one).
	if fi, err := os.Stat(arg); err == nil && fi.Mode().IsRegular() {
		if spec, err := pipeline.Load(arg, pipeline.WithKinds(stageKinds())); err == nil && spec.Shared != "" {
			return storeArg(spec.Shared), true
		}
	}
	return "", false
}

// openShared opens an existing shared store; probe for commands that
// write (gc), not for those that only read.
func openShared(c *cli.Context, arg string, probe bool) (*store.Store, error) {
	b, err := openBackend(c.Context, arg)
	if err != nil {
		return nil, err
	}
	return store.Open(c.Context, b, store.Options{SkipProbe: !probe, Existing: true})
}

func sharedVerify(c *cli.Context, arg string) error {
	repair := c.Bool("repair")
	// Repair deletes: the store is probed as for gc.
	s, err := openShared(c, arg, repair)
	if err != nil {
		return err
	}
	pg := newProgress(c, false)
	bar := pg.New("re-hashing", -1, "task", "store verify")
	rep, err := s.VerifyWith(c.Context, store.VerifyOptions{Progress: bar.Add, Repair: repair})
	bar.Close()
	pg.Close()
	if err != nil {
		return err
	}
	damaged, removed := 0, 0
	for _, p := range rep.Problems {
		if errors.Is(p.Err, store.ErrDigestMismatch) {
			damaged++
			if p.Removed {
				removed++
			}
		}
	}
	if c.Bool("json") {
		if err := printJSON(c, rep); err != nil {
			return err
		}
	} else {
		w := c.App.Writer
		fmt.Fprintf(w, "store %s: %d blobs (%d bytes) re-hashed, %d records checked, %d unreferenced blobs\n",
			rep.Store, rep.Blobs, rep.Bytes, rep.Records, rep.Unreferenced)
		for _, p := range rep.Problems {
			fmt.Fprintf(w, "  DAMAGED %s\n", p)
			if len(p.Records) > 0 {
				named := "record " + strings.Join(shortKeys(p.Records), ", ")
				if len(p.Refs) > 0 {
					named = strings.Join(p.Refs, ", ") + " (" + named + ")"
				}
				fmt.Fprintf(w, "    named by %s\n", named)
			}
			if p.Removed {
				fmt.Fprintf(w, "    removed: the next run that needs it makes it again\n")
			}
		}
	}
	if !rep.OK() {
		msg := fmt.Sprintf("store %s: %s", rep.Store, plural(len(rep.Problems), "problem"))
		switch {
		case removed > 0:
			msg += fmt.Sprintf("; %s removed: the next run of the stages that name them makes them again", plural(removed, "damaged blob"))
		case damaged > 0:
			msg += fmt.Sprintf("; 'ferry %s --repair %s' removes the %s, so the next run makes their stages again", commandPath(c), c.Args().First(), plural(damaged, "damaged blob"))
		}
		return verifyFailed(errors.New(msg))
	}
	return nil
}

// leaseLine is a live lease as du and gc list it: a stage being made, a
// copy, a run or gc at work.
func leaseLine(l store.LeaseUse) string {
	until := l.Until.Format(time.RFC3339)
	switch {
	case strings.HasPrefix(l.Name, "stage/"):
		return fmt.Sprintf("  being made on %s: %s (lease until %s)", l.Holder, l.Name, until)
	case strings.HasPrefix(l.Name, "pin/"):
		return fmt.Sprintf("  a store copy on %s keeps the blobs it is storing: %s (lease until %s)", l.Holder, l.Name, until)
	case strings.HasPrefix(l.Name, "run/"):
		return fmt.Sprintf("  a pipeline run on %s marks the stages it may make: %s (lease until %s)", l.Holder, l.Name, until)
	}
	return fmt.Sprintf("  held by %s: %s (lease until %s)", l.Holder, l.Name, until)
}

// shortKeys are record keys as du shows them: their first 12 characters.
func shortKeys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k[:min(12, len(k))]
	}
	return out
}

func sharedGC(c *cli.Context, arg string) error {
	if c.Bool("journals") {
		return usageErrorf("%s --journals: not for a shared store (its resume state is each machine's: give that machine's cache directory, a pipeline's store, instead)", commandPath(c))
	}
	if g := c.Duration("grace"); g <= 0 {
		return usageErrorf("%s --grace %v: must be positive", commandPath(c), g)
	}
	// A dry run writes nothing: not the probe's objects either.
	s, err := openShared(c, arg, !c.Bool("dry-run"))
	if err != nil {
		return err
	}
	rep, err := s.GC(c.Context, store.GCOptions{Grace: c.Duration("grace"), DryRun: c.Bool("dry-run"), PruneRecords: c.Bool("prune-records")})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, rep)
	}
	w := c.App.Writer
	verb := "removed"
	if rep.DryRun {
		verb = "would remove"
	}
	scratch := ""
	if rep.RemovedScratch > 0 {
		scratch = fmt.Sprintf(", %d scratch objects of a killed probe", rep.RemovedScratch)
	}
	if rep.RemovedTemp > 0 {
		scratch += fmt.Sprintf(", %d temp files (%s)", rep.RemovedTemp, sizeText(rep.RemovedTempBytes))
	}
	if c.Bool("prune-records") {
		verb := "pruned"
		if rep.DryRun {
			verb = "would prune"
		}
		fmt.Fprintf(w, "store %s: %s %d records no ref names, older than %v\n", rep.Store, verb, rep.PrunedRecords, c.Duration("grace"))
	}
	fmt.Fprintf(w, "store %s: %s %d blobs (%s) and %d unfinished uploads%s; kept %d blobs named by records, %d protected by live leases, %d younger than %v\n",
		rep.Store, verb, rep.RemovedBlobs, sizeText(rep.RemovedBytes), rep.AbortedUploads, scratch, rep.KeptBlobs, rep.KeptLeased, rep.KeptYoung, c.Duration("grace"))
	for _, l := range rep.Leases {
		fmt.Fprintln(w, leaseLine(l))
	}
	return nil
}

func sharedDU(c *cli.Context, arg string) error {
	s, err := openShared(c, arg, false)
	if err != nil {
		return err
	}
	u, err := s.DiskUsage(c.Context)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, u)
	}
	w := stdout(c)
	temp := ""
	if u.TempFiles > 0 {
		temp = fmt.Sprintf(", %d temp files (%s; a copy cut short: it resumes from them, gc removes them past its grace period)", u.TempFiles, sizeText(u.TempBytes))
	}
	fmt.Fprintf(w, "store %s: %d records, %d blobs (%s), %d unreferenced (%s), %d named by records but missing, %d unfinished uploads%s\n",
		u.Store, u.Records, u.Blobs, sizeText(u.BlobBytes), u.UnreferencedBlobs, sizeText(u.UnreferencedBytes), u.MissingBlobs, u.Uploads, temp)
	if len(u.ByRecord) > 0 {
		// Per record, as du of a pipeline's store is per stage: the refs
		// (pipelines/<pipeline>/<stage>) that name it, or "(no ref)": an
		// earlier result of a stage, kept until records are pruned.
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "ref\trecord\tin blobs\tshared\tmissing\tmade on\t\n")
		for _, r := range u.ByRecord {
			ref := "(no ref)"
			if len(r.Refs) > 0 {
				ref = strings.Join(r.Refs, ", ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t\n", ref, r.Key[:min(12, len(r.Key))], sizeText(r.Bytes), sizeText(r.SharedBytes), r.Missing, r.Host)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, k := range u.Unreadable {
		fmt.Fprintf(w, "  UNREADABLE record %s (its blobs count as unreferenced; 'ferry store verify' says why)\n", k)
	}
	for _, l := range u.Leases {
		fmt.Fprintln(w, leaseLine(l))
	}
	return nil
}

func storeCopyCommand() *cli.Command {
	return &cli.Command{
		Name:  "copy",
		Usage: "copy a shared store's records, their blobs and its refs into another (local directory <-> s3://), resumable, verified",
		Description: "Each blob is fetched with ranged reads and verified against its digest, then stored in DST\n" +
			"with its SHA-256 checked by the storage (multipart above 16 MiB); a record is written only\n" +
			"after its blobs. What DST has is skipped, so a copy run again after Ctrl-C or a kill goes on\n" +
			"where it stopped. A ref DST holds with another value is kept and reported. DST may be a new\n" +
			"directory or s3:// prefix.",
		ArgsUsage: "SRC DST",
		Flags: []cli.Flag{
			jsonFlag("print the result as JSON"),
			&cli.StringFlag{Name: "cache", Usage: "this machine's resume state (upload journals, partial blobs); default: the user cache directory's ferry/store"},
		},
		Action: storeCopy,
	}
}

func storeCopy(c *cli.Context) error {
	if c.NArg() != 2 {
		return usageErrorf("%s: want SRC and DST (s3://BUCKET/PREFIX or a directory), got %d arguments", commandPath(c), c.NArg())
	}
	srcArg, err := pipelineStoreOf(storeArg(c.Args().Get(0)))
	if err != nil {
		return err
	}
	dstArg, err := pipelineStoreOf(storeArg(c.Args().Get(1)))
	if err != nil {
		return err
	}
	// A pipeline's store directory is converted to the current format
	// first (its records become record objects), under its lock.
	imports := 0 // a pipeline store's import records, which stay
	if ps, lock, err := lockPipelineStore(c, srcArg); err != nil {
		return err
	} else if ps != nil {
		for _, r := range ps.Records() {
			if r.Kind == "import" {
				imports++
			}
		}
		lock.Unlock()
	}
	src, err := openShared(c, srcArg, false)
	if err != nil {
		return err
	}
	// Into a pipeline's store, the lock is held while copying (its gc
	// must not take a blob copied before its record), and the blobs
	// placed get their stamps after.
	dstPipeline, dstLock, err := lockPipelineStore(c, dstArg)
	if err != nil {
		return err
	}
	if dstLock != nil {
		defer dstLock.Unlock()
	}
	if !s3store.IsURL(dstArg) {
		if !s3store.IsURL(srcArg) {
			// One inside the other: the copy would read what it writes.
			a, _ := filepath.Abs(srcArg)
			b, _ := filepath.Abs(dstArg)
			if a != b && (strings.HasPrefix(b, a+string(filepath.Separator)) || strings.HasPrefix(a, b+string(filepath.Separator))) {
				return usageErrorf("store copy: %s and %s: one is inside the other", srcArg, dstArg)
			}
		}
		if err := copyDirDest(dstArg); err != nil {
			return err
		}
	}
	b, err := openBackend(c.Context, dstArg)
	if err != nil {
		return err
	}
	dst, err := store.Open(c.Context, b, store.Options{CacheDir: c.String("cache")})
	if err != nil {
		return err
	}
	pg := newProgress(c, false)
	bar := pg.New("copying", -1, "task", "store copy")
	rep, err := store.Copy(c.Context, src, dst, store.CopyOptions{Total: bar.SetTotal, Progress: bar.Add})
	bar.Close()
	pg.Close()
	if dstPipeline != nil {
		if serr := stampCopied(dstPipeline); err == nil {
			err = serr
		}
	}
	if err != nil && rep == nil {
		if ir := interruptedResume(c.Context, err, "what was copied is kept"); ir != nil {
			return ir
		}
		return err
	}
	if c.Bool("json") {
		if jerr := printJSON(c, rep); jerr != nil {
			return jerr
		}
		return err
	}
	w := c.App.Writer
	fmt.Fprintf(w, "%s -> %s: %d records copied (%d already there), %d blobs copied (%s; %d already there), %d refs copied (%d already there)\n",
		rep.From, rep.To, rep.Records, rep.RecordsThere, rep.Blobs, sizeText(rep.Bytes), rep.BlobsThere, rep.Refs, rep.RefsThere)
	if imports > 0 {
		fmt.Fprintf(w, "  %d import records stay in %s: they name this machine's files (every machine imports its own)\n", imports, rep.From)
	}
	for _, rc := range rep.RefsConflicts {
		fmt.Fprintf(w, "  ref %s: the source names record %s, the destination %s (the destination's kept)\n", rc.Name, rc.Source, rc.Destination)
	}
	for _, f := range rep.Failed {
		fmt.Fprintf(w, "  NOT COPIED %s\n", f)
	}
	return err
}

// copyDirDest makes sure the directory dst can take a copied store: a
// store already (shared layout or a pipeline's), an empty directory, or
// a new one in a directory that exists. Anything else (a model's
// directory, a typo's neighbour) is refused before a file is written.
func copyDirDest(dst string) error {
	fi, err := os.Stat(dst)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(dst, 0o755); err != nil {
			return errkind.Mark(errkind.BadInput, fmt.Errorf("store copy: destination %s: %w", dst, err))
		}
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return usageErrorf("store copy: destination %s is not a directory", dst)
	}
	for _, f := range []string{"format", "manifest.json"} {
		if _, err := os.Stat(filepath.Join(dst, f)); err == nil {
			return nil
		}
	}
	ents, err := os.ReadDir(dst)
	if err != nil {
		return err
	}
	for _, e := range ents {
		// What a copy killed while it opened dst (or one started beside
		// this one) made before the store's format object.
		if local.Scaffolding(e.Name()) && e.IsDir() {
			continue
		}
		return usageErrorf("store copy: destination %s is neither a ferry store nor empty (it holds %s): give a store, an empty directory or a new one", dst, e.Name())
	}
	return nil
}

// pipelineStoreOf is the store a pipeline file arg names (its shared
// store, else its directory); arg itself when it is not a file.
func pipelineStoreOf(arg string) (string, error) {
	fi, err := os.Stat(arg)
	if err != nil || !fi.Mode().IsRegular() {
		return arg, nil
	}
	spec, err := pipeline.Load(arg, pipeline.WithKinds(stageKinds()))
	if err != nil {
		return "", err
	}
	if spec.Shared != "" {
		return storeArg(spec.Shared), nil
	}
	return spec.Store, nil
}

// lockPipelineStore opens and locks arg when it is a pipeline's store
// directory (it has manifest.json), converting it to the current format;
// nil for anything else.
func lockPipelineStore(c *cli.Context, arg string) (*manifest.Store, *manifest.Lock, error) {
	if s3store.IsURL(arg) {
		return nil, nil, nil
	}
	if _, err := os.Stat(filepath.Join(arg, "manifest.json")); err != nil {
		return nil, nil, nil
	}
	s, err := manifest.Open(arg)
	if err != nil {
		return nil, nil, err
	}
	lock, err := lockStore(c, s)
	if err != nil {
		return nil, nil, err
	}
	return s, lock, nil
}

// stampCopied stamps the blobs a copy placed in a pipeline's store, so
// that its stages find them intact without hashing them again.
func stampCopied(s *manifest.Store) error {
	if err := s.Reload(); err != nil {
		return err
	}
	_, err := s.StampPlaced()
	return err
}
