//! Release announcements from one Redis server, on a subscription connection of its own (one
//! per client, shared by every waiting key, so waiters never each take a connection).

use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};

use super::bounded;
use crate::store::{BoxFuture, Names, ReleaseFeed, Released, StoreError};

pub(crate) struct PubSubFeed {
    sink: PubSubSink,
    stream: PubSubStream,
    names: Names,
    response_timeout: Duration,
}

impl PubSubFeed {
    pub(crate) async fn open(
        client: &redis::Client,
        names: Names,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let pubsub = bounded(connect_timeout, client.get_async_pubsub()).await?;
        let (sink, stream) = pubsub.split();
        Ok(Self {
            sink,
            stream,
            names,
            response_timeout,
        })
    }
}

impl ReleaseFeed for PubSubFeed {
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let channel = self.names.release_channel(key);
        Box::pin(bounded(self.response_timeout, self.sink.subscribe(channel)))
    }

    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let channel = self.names.release_channel(key);
        Box::pin(bounded(
            self.response_timeout,
            self.sink.unsubscribe(channel),
        ))
    }

    fn settle<'a>(&'a mut self, _key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            bounded(self.response_timeout, self.sink.ping::<redis::Value>()).await?;
            Ok(())
        })
    }

    fn next_release(&mut self) -> BoxFuture<'_, Option<Released>> {
        Box::pin(async move {
            loop {
                let message = self.stream.next().await?;
                if let Some(key) = self.names.released_key(message.get_channel_name()) {
                    return Some(Released {
                        key: key.to_owned(),
                        message: message.get_payload().unwrap_or_default(),
                    });
                }
            }
        })
    }
}
