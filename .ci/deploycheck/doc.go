// Package deploycheck checks, with Prometheus's own parsers, that the alert
// rules in deploy/prometheus and the queries of the dashboard in
// deploy/grafana are valid. That the metrics they name exist is checked
// against the code by cmd/flashsale TestDeployMetricsExist. Run from
// .ci/run: (cd .ci/deploycheck && go test ./...).
package deploycheck
