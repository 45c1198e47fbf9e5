package model

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// A campaign with Buckets > 1 keeps its stock in that many buckets, each
// under its own tag "<campaign id>:<bucket>" (':' never occurs in a campaign
// id), so each lands on its own Redis Cluster slot and queue partition. A
// campaign of one bucket keeps its own id as its tag, as before buckets.

// BucketOf returns the bucket of userID among n: a shopper always reaches
// the same one, so their per-user count lives in one bucket's script.
func BucketOf(userID string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(userID))
	return int(h.Sum32() % uint32(n))
}

// BucketTag returns the tag of bucket b of a campaign of n buckets: the
// campaign id itself when n <= 1.
func BucketTag(campaignID string, b, n int) string {
	if n <= 1 {
		return campaignID
	}
	return campaignID + ":" + strconv.Itoa(b)
}

// UserTag returns the tag of userID's bucket in campaign c.
func UserTag(c Campaign, userID string) string {
	return BucketTag(c.ID, BucketOf(userID, c.Buckets), c.Buckets)
}

// SplitTag returns the campaign and bucket a tag names; ok is false for
// anything BucketTag does not return. A campaign's own id is bucket 0.
func SplitTag(tag string) (campaignID string, bucket int, ok bool) {
	c, b, found := strings.Cut(tag, ":")
	if !ValidCampaignID(c) {
		return "", 0, false
	}
	if !found {
		return c, 0, true
	}
	if len(b) == 0 || len(b) > 2 || (len(b) > 1 && b[0] == '0') {
		return "", 0, false
	}
	n, err := strconv.Atoi(b)
	if err != nil || n < 0 || n >= MaxBuckets {
		return "", 0, false
	}
	return c, n, true
}

// TagOfRequest returns the tag a request id carries: the campaign id, or
// its bucket's tag in a campaign of several buckets. A request's keys
// (its result, its queue partition) live under it.
func TagOfRequest(requestID string) (string, bool) {
	i := strings.LastIndexByte(requestID, '.')
	if i < 0 {
		return "", false
	}
	tag, tail := requestID[:i], requestID[i+1:]
	if _, _, ok := SplitTag(tag); !ok || !allInSet(tail, requestIDTailLen, requestIDTailLen, hexLow, hexHigh) {
		return "", false
	}
	return tag, true
}
