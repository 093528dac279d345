package clickhousetest

import (
	"context"
	"reflect"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Answer is a query's answer read through its column types, so that a test can check the
// documented queries (docs/queries.md, the dashboards') without a struct per query.
type Answer struct {
	Cols []string
	Rows [][]any
}

// Query runs q on c and reads all of its rows.
func Query(ctx context.Context, c driver.Conn, q string) (Answer, error) {
	rows, err := c.Query(ctx, q)
	if err != nil {
		return Answer{}, err
	}
	defer rows.Close()
	var res Answer
	cts := rows.ColumnTypes()
	for _, ct := range cts {
		res.Cols = append(res.Cols, ct.Name())
	}
	for rows.Next() {
		ptrs := make([]any, len(cts))
		for i, ct := range cts {
			ptrs[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(ptrs...); err != nil {
			return res, err
		}
		row := make([]any, len(ptrs))
		for i, p := range ptrs {
			row[i] = reflect.ValueOf(p).Elem().Interface()
		}
		res.Rows = append(res.Rows, row)
	}
	return res, rows.Err()
}
