package audit

// StopDuplicateCheckAfter makes tasks.duplicate_message_id stop as if out of
// budget after n ranges; the returned func restores the default.
func StopDuplicateCheckAfter(n int) func() {
	old := dupRangeLimit
	dupRangeLimit = n
	return func() { dupRangeLimit = old }
}
