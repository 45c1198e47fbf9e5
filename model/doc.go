// Package model holds flashsale's domain types, status values, sentinel
// errors, validation and the Encode/Decode entry points of the queue message
// and the result. It depends on the standard library and internal/wire (their
// hand-written codec, itself standard library only), so every role can import
// it.
package model
