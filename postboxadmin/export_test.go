package postboxadmin

// Patterns returns the mux patterns of s's endpoints.
func Patterns(s *Server) []string { return append([]string(nil), s.patterns...) }
