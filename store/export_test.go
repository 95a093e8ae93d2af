package store

// UploadsWaiting is how many parts wait for a token of the store's parts
// in flight (Options.UploadInFlight).
func (s *Store) UploadsWaiting() int {
	if s.uploads == nil {
		return 0
	}
	return s.uploads.Waiting()
}
