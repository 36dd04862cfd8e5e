// Package house holds the tests of the repository's shape that no one package
// can hold: rules that span the whole tree, such as how long a function may
// be. It has no code of its own and must never gain any: a program or package
// that imports it is a mistake.
package house
