"""`dl2 score`: any scheduler scored on one fixed, versioned suite in every world it supports, ranked among the
built-ins (`suite` says what is run, `candidate` what is scored, `runs` runs it, `board` ranks and writes it,
`builtins` makes the published scoreboard, `kind` replays the suite's trace on the kind testbed)."""
