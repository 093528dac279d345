-- 0009: limits.candidate_of is, per evaluated limit, the id of the live rule a candidate rule's
-- limit is a candidate of ('' for every other limit, and in every row before this migration):
-- a candidate's would-be answer is recorded next to its live rule's, in the same row, for
-- `quotaflow backtest --live-candidates` and the queries of docs/backtest.md. A column of the
-- limits Nested structure: rows written before it read arrays of '' of their limits' length,
-- on 18.16 as on current servers, so that ARRAY JOIN limits keeps working over old and new
-- parts alike. Added and, on a cluster, the Distributed table made again as in 0007 (18.16
-- has no ADD COLUMN IF NOT EXISTS: the runner takes a column that exists for added).
{{- $ine := ""}}{{if .Modern}}{{$ine = "IF NOT EXISTS "}}{{end}}
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}`limits.candidate_of` Array(String) AFTER `limits.burst`;
{{- if .OnCluster}}
DROP TABLE IF EXISTS {{.DB}}.decisions{{.OnCluster}};
{{distributed "decisions"}}
{{- end}}
