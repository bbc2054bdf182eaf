"""Python clients: Producer, Consumer, Admin."""

from logstore.client.admin import Admin, NewTopic, PartitionDescription, TopicDescription
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer

__all__ = ["Admin", "Consumer", "NewTopic", "PartitionDescription", "Producer",
           "TopicDescription"]
