package dispatch

import "time"

// SetWaitReports shortens the start-up wait's reminders (waitReportFirst,
// waitReportMax) for a test that does not run in parallel; it returns the
// restore.
func SetWaitReports(first, most time.Duration) (restore func()) {
	oldFirst, oldMax := waitReportFirst, waitReportMax
	waitReportFirst, waitReportMax = first, most
	return func() { waitReportFirst, waitReportMax = oldFirst, oldMax }
}
