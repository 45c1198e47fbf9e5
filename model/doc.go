// Package model holds flashsale's domain types, status values, sentinel
// errors and the queue message codec. It depends on the standard library only,
// so every role can import it.
package model
