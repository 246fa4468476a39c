package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dhtkv/dhtkv/client"
)

// endpoint is a node's URL, such as http://127.0.0.1:8080 (here, the
// node the test binary started).

func ExampleNew() {
	// List several nodes: any of them serves any request, and the client
	// moves on to the next when one is down.
	c, err := client.New(client.Config{Endpoints: []string{endpoint, "127.0.0.1:1"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println(c.Endpoints()[1])
	// Output: http://127.0.0.1:1
}

func ExampleClient_Put() {
	c, err := client.New(client.Config{Endpoints: []string{endpoint}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Acknowledged once 1 of 1 replicas stored it (a cluster of one).
	if err := c.Put(ctx, "greeting", []byte("hello"), client.WithAck(1), client.WithFrom(1)); err != nil {
		log.Fatal(err)
	}
	v, err := c.Get(ctx, "greeting")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", v)
	// Output: hello
}

func ExampleClient_Stat() {
	c, err := client.New(client.Config{Endpoints: []string{endpoint}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A session that expires in an hour unless written again.
	if err := c.Put(ctx, "session", []byte("token"), client.WithTTL(time.Hour)); err != nil {
		log.Fatal(err)
	}
	m, err := c.Stat(ctx, "session") // the version, size and expiry, not the value
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(m.Size, m.TTL > 59*time.Minute, m.Version > 0)
	// Output: 5 true true
}

func ExampleClient_Get() {
	c, err := client.New(client.Config{Endpoints: []string{endpoint}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Get(ctx, "never written")
	fmt.Println(errors.Is(err, client.ErrNotFound))

	// A bad request carries the node's reason.
	_, err = c.Get(ctx, "k", client.WithAck(2), client.WithFrom(1))
	var bad *client.BadRequestError
	if errors.As(err, &bad) {
		fmt.Println(bad.StatusCode, bad.Reason)
	}
	// Output:
	// true
	// 400 ack=2 exceeds from=1
}

func ExampleClient_Delete() {
	c, err := client.New(client.Config{Endpoints: []string{endpoint}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Put(ctx, "short-lived", []byte("x")); err != nil {
		log.Fatal(err)
	}
	if err := c.Delete(ctx, "short-lived"); err != nil {
		log.Fatal(err)
	}
	_, err = c.Get(ctx, "short-lived")
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output: true
}

func ExampleClient_Scan() {
	c, err := client.New(client.Config{Endpoints: []string{endpoint}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, k := range []string{"fruit/apple", "fruit/banana", "fruit/cherry", "veg/leek"} {
		if err := c.Put(ctx, k, []byte("value of "+k)); err != nil {
			log.Fatal(err)
		}
	}
	// Keys from "fruit/" up to, not including, "fruit0" ('/' + 1): the
	// prefix "fruit/". Stop after two.
	for rec, err := range c.Scan(ctx, "fruit/", "fruit0", client.WithLimit(2)) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s = %s\n", rec.Key, rec.Value)
	}
	// Output:
	// fruit/apple = value of fruit/apple
	// fruit/banana = value of fruit/banana
}

func ExampleClient_Status() {
	c, err := client.New(client.Config{Endpoints: []string{endpoint}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Status(ctx, endpoint)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Node == endpoint, len(st.Members), st.Rebuilding, len(st.Warnings))
	// Output: true 1 false 0
}
