package loadgen

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

// gubernator's API (pb.gubernator.V1, gubernator.proto of gubernator-io/gubernator v2), the
// peer docs/performance.md compares with. Its messages are encoded here with protowire rather
// than generated code: a benchmark client needs two messages of a peer's API, which do not
// earn a dependency on the peer's module.
const gubernatorMethod = "/pb.gubernator.V1/GetRateLimits"

// Field numbers of the messages used (GetRateLimitsReq.requests = 1, RateLimitReq, the same
// for the response).
const (
	gubReqRequests  = 1 // GetRateLimitsReq.requests
	gubReqName      = 1 // RateLimitReq.name
	gubReqUniqueKey = 2 // RateLimitReq.unique_key
	gubReqHits      = 3 // RateLimitReq.hits
	gubReqLimit     = 4 // RateLimitReq.limit
	gubReqDuration  = 5 // RateLimitReq.duration, ms
	gubRespItems    = 1 // GetRateLimitsResp.responses
	gubRespStatus   = 1 // RateLimitResp.status: UNDER_LIMIT 0, OVER_LIMIT 1
	gubRespError    = 5 // RateLimitResp.error
)

// The limit every gubernator check asks for: a token bucket (gubernator's default algorithm)
// far above what a benchmark spends, as deploy/bench/rules.yaml's are, so that every check
// does full work.
const (
	gubernatorLimit      = 1_000_000_000
	gubernatorDurationMS = 1000
)

// rawCodec passes messages encoded by hand as they are; its name is proto's, so that the
// server decodes them as protocol buffers.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	p := v.(*[]byte)
	*p = append((*p)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// gubernatorCall returns a call sending one GetRateLimits of one request, name = the endpoint
// and unique_key = the subject, on conn.
func gubernatorCall(conn *grpc.ClientConn, endpoint string) func(context.Context, string) (bool, error) {
	var req, resp []byte
	opt := grpc.ForceCodec(rawCodec{})
	return func(ctx context.Context, id string) (bool, error) {
		req = appendGubernatorRequest(req[:0], endpoint, id)
		if err := conn.Invoke(ctx, gubernatorMethod, &req, &resp, opt); err != nil {
			return false, err
		}
		return parseGubernatorResponse(resp)
	}
}

// appendGubernatorRequest appends a GetRateLimitsReq of one RateLimitReq for key under name.
func appendGubernatorRequest(b []byte, name, key string) []byte {
	var r []byte
	r = protowire.AppendTag(r, gubReqName, protowire.BytesType)
	r = protowire.AppendString(r, name)
	r = protowire.AppendTag(r, gubReqUniqueKey, protowire.BytesType)
	r = protowire.AppendString(r, key)
	r = protowire.AppendTag(r, gubReqHits, protowire.VarintType)
	r = protowire.AppendVarint(r, 1)
	r = protowire.AppendTag(r, gubReqLimit, protowire.VarintType)
	r = protowire.AppendVarint(r, gubernatorLimit)
	r = protowire.AppendTag(r, gubReqDuration, protowire.VarintType)
	r = protowire.AppendVarint(r, gubernatorDurationMS)
	b = protowire.AppendTag(b, gubReqRequests, protowire.BytesType)
	return protowire.AppendBytes(b, r)
}

// errGubernatorReply is a GetRateLimitsResp without exactly one well-formed response.
var errGubernatorReply = errors.New("GetRateLimits: malformed reply")

// parseGubernatorResponse reads a GetRateLimitsResp of one response: allowed when its status
// is UNDER_LIMIT, an error when it carries one.
func parseGubernatorResponse(b []byte) (allowed bool, err error) {
	var item []byte
	items := 0
	if err := eachField(b, func(num protowire.Number, _ uint64, v []byte) {
		if num == gubRespItems {
			item, items = v, items+1
		}
	}); err != nil || items != 1 {
		return false, errGubernatorReply
	}
	var status uint64
	var msg string
	if err := eachField(item, func(num protowire.Number, n uint64, v []byte) {
		switch num {
		case gubRespStatus:
			status = n
		case gubRespError:
			msg = string(v)
		}
	}); err != nil {
		return false, errGubernatorReply
	}
	if msg != "" {
		return false, fmt.Errorf("GetRateLimits: %s", msg)
	}
	return status == 0, nil
}

// eachField calls f with each field of message b: its number and its varint value or bytes.
func eachField(b []byte, f func(num protowire.Number, n uint64, v []byte)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			f(num, v, nil)
			b = b[n:]
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			f(num, 0, v)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}
