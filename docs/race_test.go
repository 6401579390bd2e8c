//go:build race

package docs

// raceEnabled makes the snippet test ask go list for the export data of
// race-built packages, which the race-enabled tests of the other modules
// have already put in the build cache.
const raceEnabled = true
